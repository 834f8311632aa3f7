"""The GPU path: the CUDA lookup kernel against the cupy reference, and import safety."""

from __future__ import annotations

import numpy as np
import pytest
from cache_helpers import DIM, MODEL, TABLE

from tierserve.cache import EmbeddingCache, SetAssociativeTable
from tierserve.cache.device import cupy_or_none
from tierserve.cache.kernels import kernel_source
from tierserve.core.errors import MissingExtraError


def test_kernel_source_ships_with_the_package():
    source = kernel_source()
    assert "ts_cache_lookup" in source and "0xFF51AFD7ED558CCD" in source


def test_without_cupy_the_gpu_cache_names_the_extra(hps):
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(MissingExtraError, match=r"tierserve\[gpu\]"):
            EmbeddingCache(hps, MODEL, TABLE, DIM, 16, use_gpu=True)
    else:
        pytest.skip("cupy is installed")


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [1, 16, 33, 128])
@pytest.mark.parametrize("ways", [1, 4, 8, 40])
def test_kernel_matches_the_cupy_path(dim, ways):
    cp = cupy_or_none()
    if cp is None:
        pytest.skip("needs cupy and a CUDA device")
    from tierserve.cache.kernels import load_kernels

    kernel = load_kernels(required=True)
    table = SetAssociativeTable(4096, dim, ways, cp)
    rng = np.random.default_rng(dim * ways)
    keys = np.unique(rng.integers(-(2**40), 2**40, 3000)).astype(np.int64)
    table.place(cp.asarray(keys), cp.asarray(rng.standard_normal((keys.size, dim), dtype=np.float32)), 1)
    query = np.concatenate([keys[:2000], rng.integers(2**41, 2**42, 500), [np.iinfo(np.int64).min]])
    q = cp.asarray(query.astype(np.int64))
    ref, ref_hit, ref_hits = table.lookup(q, tick=None)
    ticks_before = table.ticks.copy()
    got, hit, hits = kernel.lookup(table, q, tick=None)
    assert hits == ref_hits
    cp.testing.assert_array_equal(hit, ref_hit)
    cp.testing.assert_array_equal(got[hit], ref[ref_hit])
    cp.testing.assert_array_equal(table.ticks, ticks_before)
    kernel.lookup(table, q, tick=5)  # stamps every hit slot, and nothing else
    slots, probe_hit = table.probe(q)
    expected = ticks_before.copy()
    expected[slots[probe_hit]] = 5
    cp.testing.assert_array_equal(table.ticks, expected)


@pytest.mark.gpu
def test_gpu_cache_uses_the_kernel_and_agrees_with_numpy(hps):
    cp = cupy_or_none()
    if cp is None:
        pytest.skip("needs cupy and a CUDA device")
    keys = np.random.default_rng(3).zipf(1.2, 5000) % 1200
    with EmbeddingCache(hps, MODEL, TABLE, DIM, 256, use_gpu=True, use_kernel=True) as gpu, EmbeddingCache(
        hps, MODEL, TABLE, DIM, 256
    ) as cpu:
        assert gpu._kernel is not None
        for batch in np.array_split(keys, 10):
            np.testing.assert_array_equal(cp.asnumpy(gpu.query(batch)), cpu.query(batch))
            np.testing.assert_array_equal(cp.asnumpy(gpu.query(cp.asarray(batch))), cpu.query(batch))
