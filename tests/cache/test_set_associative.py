"""The dynamic cache's table: probing, LRU-ish eviction at batch granularity, capacity."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.cache.device import array_module, to_host
from tierserve.cache.hashing import set_of
from tierserve.cache.set_associative import EMPTY, SetAssociativeTable


def _table(use_gpu, capacity=64, dim=4, ways=4):
    return SetAssociativeTable(capacity, dim, ways, array_module(use_gpu))


def _vals(keys, dim=4):
    return np.repeat(np.asarray(keys, np.float32)[:, None], dim, axis=1)


def _keys_in_set(num_sets, target, count, start=0):
    """``count`` keys that all map to set ``target``."""
    keys = np.arange(start, start + 200_000, dtype=np.int64)
    return keys[set_of(keys, num_sets) == target][:count]


def test_insert_then_lookup_returns_the_inserted_vectors(use_gpu):
    t = _table(use_gpu, capacity=1024)
    xp = t.xp
    keys = np.arange(100, 300, dtype=np.int64)
    inserted, evicted = t.place(xp.asarray(keys), xp.asarray(_vals(keys)), tick=1)
    assert evicted == 0 and inserted == t.size
    got, hit, hits = t.lookup(xp.asarray(keys), tick=2)
    hit = to_host(hit)
    assert hits == hit.sum() and hits >= 180  # a few may not fit their set
    np.testing.assert_array_equal(to_host(got)[hit], _vals(keys)[hit])
    _, miss_hit, n = t.lookup(xp.asarray(np.arange(1000, 1100, dtype=np.int64)))
    assert n == 0 and not to_host(miss_hit).any()


def test_capacity_is_never_exceeded_and_keys_are_unique(use_gpu):
    t = _table(use_gpu, capacity=100, ways=4)
    xp = t.xp
    assert t.capacity == 100
    rng = np.random.default_rng(0)
    for tick in range(1, 60):
        keys = np.unique(rng.integers(0, 5000, 80))
        _, hit = t.probe(xp.asarray(keys))
        new = keys[~to_host(hit)]
        t.place(xp.asarray(new), xp.asarray(_vals(new)), tick)
        held = to_host(t.cached_keys())
        assert held.size == t.size <= t.capacity
        assert np.unique(held).size == held.size
    values = to_host(t.values).reshape(t.num_sets, t.ways, -1)[:, :, 0]
    keys = to_host(t.keys)
    live = keys != EMPTY
    np.testing.assert_array_equal(values[live], keys[live].astype(np.float32))


def test_least_recently_used_way_is_evicted(use_gpu):
    t = _table(use_gpu, capacity=32, ways=4)
    xp = t.xp
    five = _keys_in_set(t.num_sets, 3, 5)
    t.place(xp.asarray(five[:4]), xp.asarray(_vals(five[:4])), tick=1)
    t.lookup(xp.asarray(five[[0, 2, 3]]), tick=2)  # five[1] is now the oldest
    inserted, evicted = t.place(xp.asarray(five[4:]), xp.asarray(_vals(five[4:])), tick=3)
    assert (inserted, evicted) == (1, 1)
    held = set(to_host(t.cached_keys()).tolist())
    assert held == {five[0], five[2], five[3], five[4]}


def test_slots_used_by_the_current_batch_are_not_evicted(use_gpu):
    t = _table(use_gpu, capacity=32, ways=4)
    xp = t.xp
    six = _keys_in_set(t.num_sets, 5, 6)
    t.place(xp.asarray(six[:4]), xp.asarray(_vals(six[:4])), tick=1)
    t.lookup(xp.asarray(six[:3]), tick=7)  # three hot in batch 7
    inserted, evicted = t.place(xp.asarray(six[4:]), xp.asarray(_vals(six[4:])), tick=7)
    assert (inserted, evicted) == (1, 1)  # only the cold way could go
    held = set(to_host(t.cached_keys()).tolist())
    assert set(six[:3].tolist()) <= held


def test_overwrite_and_invalidate_touch_only_cached_keys(use_gpu):
    t = _table(use_gpu, capacity=256)
    xp = t.xp
    keys = np.arange(0, 40, dtype=np.int64)
    t.place(xp.asarray(keys), xp.asarray(_vals(keys)), tick=1)
    present = to_host(t.cached_keys())
    assert t.overwrite(xp.asarray(np.array([present[0], 999])), xp.asarray(np.full((2, 4), 5, np.float32))) == 1
    got, _, _ = t.lookup(xp.asarray(present[:1]))
    assert (to_host(got) == 5).all()
    size = t.size
    assert t.invalidate(xp.asarray(np.array([present[1], 12345]))) == 1
    assert t.size == size - 1
    _, hit, _ = t.lookup(xp.asarray(present[1:2]))
    assert not to_host(hit).any()
    t.clear()
    assert t.size == 0 and to_host(t.cached_keys()).size == 0


def test_the_empty_marker_is_never_a_hit(use_gpu):
    t = _table(use_gpu, capacity=16)
    xp = t.xp
    _, hit, hits = t.lookup(xp.asarray(np.array([EMPTY, 0], dtype=np.int64)))
    assert hits == 0 and not to_host(hit).any()


@pytest.mark.parametrize("stride", [1, 2, 1000, 2**20, 2**32, 0x9E3779B1])
def test_sets_are_spread_evenly_for_sequential_and_strided_keys(stride):
    keys = np.arange(100_000, dtype=np.int64) * stride
    counts = np.bincount(set_of(keys, 1000), minlength=1000)
    assert counts.min() > 50 and counts.max() < 150


def test_bad_sizes_are_rejected():
    with pytest.raises(ValueError):
        SetAssociativeTable(0, 4)
    with pytest.raises(ValueError):
        SetAssociativeTable(8, 0)
    small = SetAssociativeTable(3, 4, ways=8)  # fewer slots than ways: one set
    assert small.capacity == 3 and small.ways == 3


def test_large_batches_stamp_a_rotating_sample_of_hits():
    from tierserve.cache.set_associative import STAMP_ALL, STAMP_STRIDE

    t = SetAssociativeTable(4 * STAMP_ALL, 4, ways=2)
    keys = np.arange(2 * STAMP_ALL, dtype=np.int64)
    t.place(keys, _vals(keys), tick=1)
    held = t.cached_keys()
    t.lookup(held, tick=2)
    slots, _ = t.probe(held)
    stamped = np.count_nonzero(t.ticks[slots] == 2)
    assert stamped == len(range(2 % STAMP_STRIDE, held.size, STAMP_STRIDE))
    for tick in range(3, 3 + STAMP_STRIDE):
        t.lookup(held, tick=tick)
    assert (t.ticks[slots] >= 3).all()  # every hit stamped within STAMP_STRIDE batches


def test_ages_survive_the_tick_counter_wrapping():
    t = SetAssociativeTable(8, 4, ways=4)
    three = _keys_in_set(t.num_sets, 1, 5)
    t.place(three[:4], _vals(three[:4]), tick=2**32 - 2)  # just before the wrap
    t.lookup(three[1:4], tick=2**32 + 3)  # after it: stored as 3
    inserted, evicted = t.place(three[4:], _vals(three[4:]), tick=2**32 + 4)
    assert (inserted, evicted) == (1, 1)
    assert three[0] not in set(t.cached_keys().tolist())
