"""tierserve's embedded trainer: HugeCTR's Python training API on numpy (and cupy)."""
