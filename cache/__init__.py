"""The embedding cache in front of the parameter server, on numpy (CPU) or cupy (GPU)."""
