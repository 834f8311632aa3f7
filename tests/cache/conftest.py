"""Fixtures of the cache tests: a real HierarchicalParameterServer (hash_map tier) and the
numpy / cupy backends (cupy runs only where it sees a GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

if str(Path(__file__).parent) not in sys.path:  # for `import cache_helpers`, `import dict_ps`
    sys.path.insert(0, str(Path(__file__).parent))

from cache_helpers import make_ps_config  # noqa: E402

from tierserve.cache.device import cupy_or_none  # noqa: E402
from tierserve.ps.hierarchy import HierarchicalParameterServer  # noqa: E402


@pytest.fixture(params=[False, pytest.param(True, marks=pytest.mark.gpu)], ids=["numpy", "cupy"])
def use_gpu(request) -> bool:
    """Run a test on numpy, and again on cupy where a CUDA device is present."""
    if request.param and cupy_or_none() is None:
        pytest.skip("needs cupy and a CUDA device")
    return request.param


@pytest.fixture
def hps(tmp_path):
    """The real parameter server, hash_map volatile tier, 1000 rows of dim 8 loaded."""
    with HierarchicalParameterServer(make_ps_config(tmp_path)) as ps:
        yield ps
