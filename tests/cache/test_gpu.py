"""The GPU path: the CUDA lookup kernel against the cupy reference, the insert kernel against
the numpy kernels key by key, and import safety."""

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
    # hit_rate_threshold=1: every insert is synchronous, so both see the same sequence
    with EmbeddingCache(hps, MODEL, TABLE, DIM, 256, use_gpu=True, use_kernel=True,
                        hit_rate_threshold=1.0) as gpu, EmbeddingCache(
        hps, MODEL, TABLE, DIM, 256, hit_rate_threshold=1.0
    ) as cpu:
        assert gpu._kernel is not None and gpu._table.kernels is gpu._kernel
        for batch in np.array_split(keys, 10):
            np.testing.assert_array_equal(cp.asnumpy(gpu.query(batch)), cpu.query(batch))
            np.testing.assert_array_equal(cp.asnumpy(gpu.query(cp.asarray(batch))), cpu.query(batch))
            assert gpu.flush(60) and cpu.flush(60)
        # The same lookups, stamps and inserts (kernel vs numba): the same keys stay cached.
        g, c = gpu.metrics(), cpu.metrics()
        assert (g.hits, g.misses, g.inserted, g.evicted) == (c.hits, c.misses, c.inserted, c.evicted)
        held = np.sort(cp.asnumpy(gpu._table.cached_keys()))
        np.testing.assert_array_equal(held, np.sort(cpu._table.cached_keys()))


def _crowded(rng, capacity, dim, ways, tick):
    """A numpy table 60% full, some slots stamped ``tick``, and its keys."""
    table = SetAssociativeTable(capacity, dim, ways)
    held = rng.choice(np.arange(1, 10 * capacity), int(0.6 * capacity), replace=False).astype(np.int64)
    table.insert(held, rng.standard_normal((held.size, dim), dtype=np.float32), tick - 3)
    table.ticks[:] = (tick - rng.integers(0, 6, table.ticks.size)) & 0xFFFFFFFF
    return table, table.keys[table.keys != np.iinfo(np.int64).min]


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [1, 16, 33, 128])
@pytest.mark.parametrize("ways", [1, 2, 4, 8])
@pytest.mark.parametrize("n", [1, 300, 20000])
def test_insert_kernel_matches_the_numpy_kernels_key_by_key(dim, ways, n):
    """``ts_cache_insert`` against ``plan_insert`` + ``apply_insert`` on the same table:
    every key's slot, the counts, and the whole table after (keys, ticks, rows).  Crowded
    sets (n up to 5x the capacity, many blocks and chunks), cached keys, the empty marker and
    slots stamped by this batch are all in it."""
    cp = cupy_or_none()
    if cp is None:
        pytest.skip("needs cupy and a CUDA device")
    from tierserve.cache import cpu_kernels
    from tierserve.cache.kernels import load_kernels

    kernels = load_kernels(required=True)
    tick = 2**32 + 7  # ticks wrap
    rng = np.random.default_rng(dim * 100 + ways * 10 + n)
    ref, held = _crowded(rng, 4096, dim, ways, tick)
    new = rng.choice(np.arange(10**8, 10**8 + 10 * n), n, replace=False)
    keys = np.concatenate([new, held[: n // 10], [np.iinfo(np.int64).min]])
    keys = rng.permutation(keys).astype(np.int64)
    vectors = rng.standard_normal((keys.size, dim), dtype=np.float32)
    gpu = SetAssociativeTable(4096, dim, ways, cp)
    gpu.keys[...] = cp.asarray(ref.keys)
    gpu.ticks[...] = cp.asarray(ref.ticks)
    gpu.values[...] = cp.asarray(ref.values)

    slots, inserted, evicted = kernels.insert(gpu, cp.asarray(keys), cp.asarray(vectors), tick)
    want_slots = np.empty(keys.size, dtype=np.int64)
    want_evicted = cpu_kernels.plan_insert(keys, ref.keys, ref.ticks, tick, want_slots)
    want_inserted = cpu_kernels.apply_insert(keys, vectors, want_slots, ref.keys, ref.values)
    np.testing.assert_array_equal(cp.asnumpy(slots), want_slots)
    assert (inserted, evicted) == (want_inserted, want_evicted)
    np.testing.assert_array_equal(cp.asnumpy(gpu.keys), ref.keys)
    np.testing.assert_array_equal(cp.asnumpy(gpu.ticks), ref.ticks)
    np.testing.assert_array_equal(cp.asnumpy(gpu.values), ref.values)
    assert (inserted > 0 or n == 1) and (n < 20000 or evicted > 0)


@pytest.mark.gpu
def test_gpu_table_insert_uses_the_kernel_and_counts_its_size():
    cp = cupy_or_none()
    if cp is None:
        pytest.skip("needs cupy and a CUDA device")
    from tierserve.cache.kernels import load_kernels

    with_kernel = SetAssociativeTable(1024, 8, 2, cp)
    with_kernel.kernels = load_kernels(required=True)
    passes = SetAssociativeTable(1024, 8, 2, cp)
    keys = cp.arange(600, dtype=cp.int64)
    vectors = cp.ones((600, 8), dtype=cp.float32)
    assert with_kernel.insert(keys, vectors, 1) == passes.insert(keys, vectors, 1)
    assert with_kernel.size == passes.size == int(cp.count_nonzero(with_kernel.keys != np.iinfo(np.int64).min))
    cp.testing.assert_array_equal(with_kernel.keys, passes.keys)  # the same rule: the same slots


@pytest.mark.gpu
def test_query_tables_reads_every_table_in_one_launch_as_each_cache_alone(tmp_path):
    """``ModelEmbeddingCache.query_tables`` on the GPU (one ``ts_cache_lookup_tables``
    launch over tables of different dims and ways, then each cache's misses) against the
    same caches on the CPU, request by request: the same rows, hits, misses and inserts."""
    cp = cupy_or_none()
    if cp is None:
        pytest.skip("needs cupy and a CUDA device")
    from cache_helpers import DEFAULT, vectors_for

    from tierserve.cache import ModelEmbeddingCache
    from tierserve.ps.config import ModelConfig, PSConfig
    from tierserve.ps.hash_map import HashMapConfig
    from tierserve.ps.hierarchy import HierarchicalParameterServer
    from tierserve.ps.sparse_file import write_sparse_model

    dims, ways, names = [16, 3, 128], [2, 1, 8], ["t0", "t1", "t2"]
    folders = []
    for t, dim in enumerate(dims):
        folders.append(str(tmp_path / f"m{t}_sparse_{t}.model"))
        keys = np.arange(2000, dtype=np.int64)
        write_sparse_model(folders[-1], keys, vectors_for(keys, t, dim))
    config = PSConfig(volatile_db=HashMapConfig(), models=[ModelConfig(
        model=MODEL, sparse_files=folders, embedding_vecsize_per_table=dims,
        maxnum_catfeature_query_per_table_per_sample=[1] * 3,
        default_value_for_each_table=[DEFAULT] * 3, embedding_table_names=names,
    )])

    def caches(ps, gpu):
        return ModelEmbeddingCache(MODEL, [
            EmbeddingCache(ps, MODEL, name, dim, 256, ways=w, use_gpu=gpu,
                           use_kernel=True if gpu else None, hit_rate_threshold=1.0)
            for name, dim, w in zip(names, dims, ways)
        ])

    rng = np.random.default_rng(5)
    with HierarchicalParameterServer(config) as ps, caches(ps, True) as gpu, caches(ps, False) as cpu:
        for step in range(12):
            sizes = [[1, 1, 1], [40, 0, 7], [500, 300, 200]][step % 3]
            request = [np.unique(rng.zipf(1.3, n) % 2500).astype(np.int64) for n in sizes]
            got = gpu.query_tables(request)
            want = cpu.query_tables(request)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(cp.asnumpy(g), w)
        assert isinstance(gpu._fusable, tuple)  # the one-launch path, not one query per table
        for g, c in zip(gpu.metrics(), cpu.metrics()):
            assert (g.hits, g.misses, g.inserted, g.evicted) == (c.hits, c.misses, c.inserted, c.evicted)
            assert g.hits > 0 and g.misses > 0
