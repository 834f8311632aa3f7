"""The numba kernels of the CPU table against the array-pass (``*_xp``) path on numpy, which
is the path cupy runs: same sets, same hits, same vectors, same stamps, same evictions."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from tierserve.cache import cpu_kernels
from tierserve.cache.hashing import set_of
from tierserve.cache.set_associative import EMPTY, STAMP_ALL, SetAssociativeTable


def _pair(capacity, dim, ways):
    """Two empty tables: one run by the kernels, one by the ``*_xp`` methods."""
    return SetAssociativeTable(capacity, dim, ways), SetAssociativeTable(capacity, dim, ways)


def _contents(t):
    """``{key: (vector, tick)}`` of everything held: independent of which way holds a key."""
    flat = t.keys.reshape(-1)
    live = np.flatnonzero(flat != EMPTY)
    return {int(flat[s]): (t.values[s].tobytes(), int(t.ticks[s])) for s in live}


@pytest.mark.parametrize("num_sets", [1, 3, 1000, 2**20 + 7, 2**32 - 1])
def test_the_scalar_set_function_is_hashing_set_of(num_sets):
    rng = np.random.default_rng(num_sets % 1000)
    keys = np.concatenate([
        rng.integers(-(2**63), 2**63 - 1, 5000, dtype=np.int64, endpoint=True),
        np.arange(-50, 50, dtype=np.int64),
        np.array([EMPTY, 2**63 - 1], dtype=np.int64),
    ])

    @njit
    def sets(keys, num_sets):
        out = np.empty(keys.size, dtype=np.int64)
        for i in range(keys.size):
            out[i] = cpu_kernels.set_of_key(keys[i], num_sets)
        return out

    np.testing.assert_array_equal(sets(keys, num_sets), set_of(keys, num_sets))


@pytest.mark.parametrize("ways", [1, 2, 3, 4, 8])
@pytest.mark.parametrize(("capacity", "dim"), [(600, 1), (600, 16), (64, 16), (64, 33)])
def test_insert_probe_and_lookup_agree_with_the_array_passes(ways, capacity, dim):
    kern, ref = _pair(capacity, dim, ways)
    rng = np.random.default_rng(ways * 100 + dim + capacity)
    evicted = 0
    universe = rng.integers(-(2**40), 2**40, 3000)
    for tick in range(1, 40):
        # a batch: look up (stamping), then insert the misses, hottest first
        batch = universe[rng.zipf(1.3, 300) % universe.size].astype(np.int64)
        if tick % 7 == 0:
            batch[::50] = EMPTY  # the empty marker: never a hit, never inserted
        misses = np.empty(batch.size, dtype=np.int64)
        got, hit, hits = kern.lookup(batch, tick, misses=misses)
        want, want_hit, want_hits = ref.lookup_xp(batch, tick)
        np.testing.assert_array_equal(misses[: batch.size - hits], np.flatnonzero(~want_hit))
        assert hits == want_hits
        np.testing.assert_array_equal(hit, want_hit)
        np.testing.assert_array_equal(got[hit], want[want_hit])
        slots, probe_hit = kern.probe(batch)
        ref_slots, ref_probe_hit = ref.probe_xp(batch)
        np.testing.assert_array_equal(probe_hit, ref_probe_hit)
        np.testing.assert_array_equal(kern.keys.reshape(-1)[slots[probe_hit]], batch[probe_hit])

        missed = batch[~hit]
        missed = missed[missed != EMPTY]
        unique, counts = np.unique(missed, return_counts=True)
        unique = unique[np.argsort(-counts, kind="stable")]
        vectors = rng.standard_normal((unique.size, dim), dtype=np.float32)
        done = kern.insert(unique, vectors, tick)
        assert done == ref.insert_xp(unique, vectors, tick)
        evicted += done[1]
        assert kern.size == ref.size == np.count_nonzero(kern.keys != EMPTY) <= kern.capacity
        assert _contents(kern) == _contents(ref)
    assert evicted > 0 or capacity > 100


@pytest.mark.parametrize("ways", [2, 4])
def test_large_batches_stamp_the_same_sample_of_hits(ways):
    kern, ref = _pair(8 * STAMP_ALL, 4, ways)
    keys = np.arange(6 * STAMP_ALL, dtype=np.int64)
    vectors = np.random.default_rng(0).standard_normal((keys.size, 4), dtype=np.float32)
    kern.place(keys, vectors, 1)
    ref.place_xp(keys, vectors, 1)
    held = kern.cached_keys()
    assert held.size > STAMP_ALL
    batch = np.concatenate([held, held[:100], keys[::3]])  # repeats and misses
    for tick in (2, 3, 5):
        kern.lookup(batch, tick)
        ref.lookup_xp(batch, tick)
        assert _contents(kern) == _contents(ref)
    kern.lookup(batch)  # no tick: nothing stamped
    assert _contents(kern) == _contents(ref)


def test_insert_skips_cached_keys_and_the_empty_marker():
    t = SetAssociativeTable(64, 2, 2)
    keys = np.array([5, 6, EMPTY, 7], dtype=np.int64)
    assert t.insert(keys, np.ones((4, 2), np.float32), 1) == (3, 0)
    again = np.array([6, 5, 8], dtype=np.int64)
    inserted, evicted = t.insert(again, np.full((3, 2), 2, np.float32), 2)
    assert (inserted, evicted) == (1, 0) and t.size == 4
    got, hit, hits = t.lookup(np.array([5, 6, 7, 8, EMPTY], dtype=np.int64))
    assert hits == 4 and hit.tolist() == [True] * 4 + [False]
    np.testing.assert_array_equal(got[:4, 0], [1, 1, 1, 2])  # cached rows not rewritten


def test_cpu_arrays_start_on_a_cache_line():
    t = SetAssociativeTable(1000, 16, 2)
    for array in (t.keys, t.ticks, t.values):
        assert array.ctypes.data % 64 == 0 and array.flags.c_contiguous
    assert (t.keys == EMPTY).all() and not t.ticks.any() and not t.values.any()


@pytest.mark.parametrize("n", [0, 1, 7, 3000])
def test_distinct_by_count_is_unique_ordered_by_count_then_first_seen(n):
    rng = np.random.default_rng(n)
    keys = np.concatenate([rng.zipf(1.2, n) % 500, -rng.integers(0, 2**62, n // 3)]).astype(np.int64)
    rng.shuffle(keys)
    distinct, inverse = cpu_kernels.distinct_by_count(keys)
    np.testing.assert_array_equal(distinct[inverse], keys)
    unique, first, counts = np.unique(keys, return_index=True, return_counts=True)
    order = np.lexsort((first, -counts))  # by count descending, then first position
    np.testing.assert_array_equal(distinct, unique[order])
