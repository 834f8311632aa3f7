"""Shared helpers of the cache tests: the test model, deterministic vectors, a ps config."""

from __future__ import annotations

import numpy as np

from tierserve.ps.config import ModelConfig, PSConfig
from tierserve.ps.hash_map import HashMapConfig
from tierserve.ps.sparse_file import write_sparse_model

MODEL = "m"
TABLE = "sparse_embedding1"
DIM = 8
DEFAULT = -1.0


def vectors_for(keys: np.ndarray, version: int = 0, dim: int = DIM) -> np.ndarray:
    """Deterministic vectors: column 0 is the key, column 1 the version, then noise."""
    keys = np.asarray(keys, dtype=np.int64)
    out = np.empty((keys.size, dim), dtype=np.float32)
    out[:, 0] = keys
    out[:, 1] = version
    if dim > 2:
        rng = np.random.default_rng(version)
        out[:, 2:] = rng.standard_normal((keys.size, dim - 2))
    return out


def make_ps_config(tmp_path, rows: int = 1000, dim: int = DIM, **model_fields) -> PSConfig:
    """A ps config with one model ``m`` of one table of keys 0 .. rows-1 on disk."""
    folder = tmp_path / "m0_sparse_0.model"
    keys = np.arange(rows, dtype=np.int64)
    write_sparse_model(folder, keys, vectors_for(keys, 0, dim))
    fields = dict(
        model=MODEL,
        sparse_files=[str(folder)],
        embedding_vecsize_per_table=[dim],
        maxnum_catfeature_query_per_table_per_sample=[1],
        default_value_for_each_table=[DEFAULT],
    )
    fields.update(model_fields)
    return PSConfig(volatile_db=HashMapConfig(), models=[ModelConfig(**fields)])
