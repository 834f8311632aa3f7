"""The documented partition mixer, eviction policies and tier stats."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.ps.eviction import EvictLeastUsed, EvictOldest, EvictRandom, make_policy
from tierserve.ps.partition import group_by_partition, mix64, partition_of
from tierserve.ps.stats import LatencyHistogram, TierStats

M64 = (1 << 64) - 1


def splitmix64_finalizer(key: int) -> int:
    """The mixer as docs/formats.md (Files and messages 7, 9) documents it, in plain Python
    integers."""
    z = key & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def test_mix64_is_the_documented_splitmix64_finalizer():
    keys = [0, 1, 2, 12345, -1, -(2**63), 2**63 - 1, 0x9E3779B97F4A7C15 - 2**64]
    got = mix64(np.array(keys, dtype=np.int64))
    assert got.tolist() == [splitmix64_finalizer(k) for k in keys]


def test_partitions_are_mix_mod_n_and_grouping_is_stable():
    keys = np.arange(-500, 500, dtype=np.int64)
    parts = partition_of(keys, 7)
    assert parts.tolist() == [splitmix64_finalizer(k) % 7 for k in keys.tolist()]
    assert np.bincount(parts).min() > 100  # spread evenly
    order, bounds = group_by_partition(keys, 7)
    for p in range(7):
        members = order[bounds[p] : bounds[p + 1]]
        assert (parts[members] == p).all()
        assert (np.diff(members) > 0).all()  # request order kept within a partition
    assert partition_of(keys, 1).tolist() == [0] * keys.size


def test_policies_pick_the_smallest_statistic_or_random():
    rng = np.random.default_rng(0)
    stats = np.array([5, 1, 9, 3, 7])
    assert sorted(EvictOldest().select(stats, 5, 2, rng).tolist()) == [1, 3]
    assert sorted(EvictLeastUsed().select(stats, 5, 3, rng).tolist()) == [0, 1, 3]
    victims = EvictRandom().select(None, 100, 30, rng)
    assert len(set(victims.tolist())) == 30 and victims.max() < 100
    assert EvictRandom().select(None, 3, 5, rng).tolist() == [0, 1, 2]
    assert isinstance(make_policy("evict_oldest"), EvictOldest)
    with pytest.raises(ValueError):
        make_policy("evict_everything")


def test_latency_histogram_and_snapshot():
    h = LatencyHistogram()
    for seconds in (0.00005, 0.0003, 0.0003, 0.2, 9.0):
        h.observe(seconds)
    assert h.count == 5 and h.cumulative()[-1] == (float("inf"), 5)
    assert h.quantile(0.5) == 0.0005 and h.quantile(1.0) == float("inf")
    stats = TierStats("hash_map")
    with stats.timed("lookup"):
        stats.hits += 3
    stats.skipped += 2
    snap = stats.snapshot()
    assert snap["hits"] == 3 and snap["latency"]["lookup"]["count"] == 1
    assert snap["skipped"] == 2
