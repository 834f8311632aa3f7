"""The embedding cache with compact rows (storage_dtype float16 / int8), on numpy and, where a
CUDA device is present, cupy: it answers what the parameter server serves, holds fewer bytes,
and takes updates and refreshes through its encoder."""

from __future__ import annotations

import numpy as np
import pytest
from cache_helpers import DEFAULT, DIM, MODEL, TABLE, make_ps_config, vectors_for

from tierserve.cache import CreateEmbeddingCache, EmbeddingCache
from tierserve.cache.device import to_host
from tierserve.ps.hierarchy import HierarchicalParameterServer
from tierserve.ps.row_codec import RowCodec


def _agree(got, served, dtype):
    """The cache re-encodes the served float32 rows: float16 is exact; an int8 row keeps its
    bytes and may move its scale by a float32 rounding step."""
    if dtype == "float16":
        np.testing.assert_array_equal(got, served)
    else:
        tol = 4 * np.spacing(np.abs(served).max(axis=1, keepdims=True))
        assert (np.abs(got - served) <= tol).all()


@pytest.mark.parametrize("dtype", ["float16", "int8"])
@pytest.mark.parametrize("cache_type", ["dynamic", "static"])
def test_cache_answers_what_the_server_serves(tmp_path, use_gpu, dtype, cache_type):
    config = make_ps_config(tmp_path, storage_dtype=dtype, embedding_cache_type=cache_type,
                            gpucacheper=1.0 if cache_type == "static" else 0.3)  # fmt: skip
    with HierarchicalParameterServer(config) as ps, CreateEmbeddingCache(
        ps, 0, use_gpu, None, config, MODEL
    ) as caches:  # fmt: skip
        cache = caches.cache(TABLE)
        assert cache.codec.dtype.value == dtype
        keys = np.array([3, 999, 3, 5000, 17], dtype=np.int64)
        for _ in range(3):  # misses, then hits
            got = to_host(cache.query(keys))
            assert got.dtype == np.float32 and got.shape == (5, DIM)
            served = ps.lookup(MODEL, TABLE, keys)
            _agree(got, served, dtype)
        assert (got[3] == DEFAULT).all()
        codec = RowCodec(dtype, DIM)
        loaded = vectors_for(np.arange(1000))[keys[[0, 1, 4]]]  # what the sparse file holds
        np.testing.assert_array_equal(served[[0, 1, 4]], codec.decode(codec.encode(loaded)))
        # write-through update: quantized on the way in, served and cached alike
        new = np.random.default_rng(5).standard_normal((2, DIM)).astype(np.float32)
        caches.update(TABLE, np.array([3, 17]), new)
        got = to_host(cache.query(np.array([3, 17])))
        _agree(got, ps.lookup(MODEL, TABLE, [3, 17]), dtype)
        np.testing.assert_allclose(got, new, atol=np.abs(new).max() * 2 / 255)
        assert cache.refresh() >= 2
        _agree(to_host(cache.query(np.array([3, 17]))), ps.lookup(MODEL, TABLE, [3, 17]), dtype)


@pytest.mark.parametrize(("dtype", "ratio"), [("float16", 0.5), ("int8", 0.375)])
def test_cache_rows_take_fewer_bytes(dtype, ratio):
    from dict_ps import DictParameterServer

    ps = DictParameterServer({(MODEL, TABLE): 16})
    sizes = {}
    for d in ("float32", dtype):
        with EmbeddingCache(ps, MODEL, TABLE, 16, 10_000, storage_dtype=d) as cache:
            sizes[d] = cache._table.values.nbytes
    assert sizes[dtype] == sizes["float32"] * ratio
