"""Fixtures of the cache tests: a real HierarchicalParameterServer (hash_map tier) and the
numpy / cupy backends (cupy runs only where it sees a GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tierserve.cache.device import cupy_or_none
from tierserve.ps.config import HashMapConfig, ModelConfig, PSConfig
from tierserve.ps.hierarchy import HierarchicalParameterServer
from tierserve.ps.sparse_file import write_sparse_model

if str(Path(__file__).parent) not in sys.path:  # for `import dict_ps`
    sys.path.insert(0, str(Path(__file__).parent))

MODEL = "m"
TABLE = "sparse_embedding1"
DIM = 8
DEFAULT = -1.0


@pytest.fixture(params=[False, pytest.param(True, marks=pytest.mark.gpu)], ids=["numpy", "cupy"])
def use_gpu(request) -> bool:
    """Run a test on numpy, and again on cupy where a CUDA device is present."""
    if request.param and cupy_or_none() is None:
        pytest.skip("needs cupy and a CUDA device")
    return request.param


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


@pytest.fixture
def hps(tmp_path):
    """The real parameter server, hash_map volatile tier, 1000 rows of dim 8 loaded."""
    with HierarchicalParameterServer(make_ps_config(tmp_path)) as ps:
        yield ps
