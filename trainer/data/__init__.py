"""Data readers (Norm, Raw, Parquet), the data generator and the Criteo converter."""
