"""One contract for every tier: hash_map, parallel_hash_map, Redis, Redis Cluster, RocksDB."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tierserve.core.errors import InvalidInputError, ReadOnlyError

DIM = 8


def vectors(rng, n, dim=DIM):
    return rng.standard_normal((n, dim)).astype(np.float32)


def distinct_keys(rng, n):
    return rng.choice(np.int64(2**62), size=n, replace=False).astype(np.int64) - 2**61


def test_insert_then_lookup_returns_the_vectors(tiers):
    tier = tiers()
    tag = tiers.tag(tier)
    rng = np.random.default_rng(1)
    keys, emb = distinct_keys(rng, 500), vectors(rng, 500)
    tier.insert(tag, keys, emb)
    got, found = tier.lookup(tag, keys)
    assert got.dtype == np.float32 and got.shape == (500, DIM)
    assert found.all()
    np.testing.assert_array_equal(got, emb)
    assert tier.size(tag) == 500
    assert sorted(tier.list_keys(tag).tolist()) == sorted(keys.tolist())
    assert tier.stats.hits == 500 and tier.stats.inserts == 500


def test_overwrite_replaces_vectors_and_keeps_size(tiers):
    tier = tiers()
    tag = tiers.tag(tier)
    rng = np.random.default_rng(2)
    keys = distinct_keys(rng, 300)
    tier.insert(tag, keys, vectors(rng, 300))
    newer = vectors(rng, 150)
    tier.insert(tag, keys[::2], newer)
    got, found = tier.lookup(tag, keys[::2])
    assert found.all()
    np.testing.assert_array_equal(got, newer)
    assert tier.size(tag) == 300


def test_repeated_key_in_one_insert_keeps_the_last(tiers):
    tier = tiers()
    tag = tiers.tag(tier)
    keys = np.array([5, 6, 5, 7, 5], dtype=np.int64)
    emb = np.arange(5 * DIM, dtype=np.float32).reshape(5, DIM)
    tier.insert(tag, keys, emb)
    got, found = tier.lookup(tag, np.array([5, 6, 7], dtype=np.int64))
    assert found.all()
    np.testing.assert_array_equal(got, emb[[4, 1, 3]])
    assert tier.size(tag) == 3


def test_unknown_keys_are_reported_missing(tiers):
    tier = tiers()
    tag = tiers.tag(tier)
    rng = np.random.default_rng(3)
    keys, emb = distinct_keys(rng, 100), vectors(rng, 100)
    tier.insert(tag, keys, emb)
    unknown = keys.max() + 1 + np.arange(10)
    query = np.concatenate([keys[:10], unknown, keys[10:20]])
    got, found = tier.lookup(tag, query)
    np.testing.assert_array_equal(found, np.r_[[True] * 10, [False] * 10, [True] * 10])
    np.testing.assert_array_equal(got[found], emb[:20])
    assert tier.stats.misses == 10
    empty, none_found = tier.lookup(tag, np.empty(0, dtype=np.int64))
    assert empty.shape == (0, DIM) and none_found.shape == (0,)


def test_negative_zero_and_extreme_keys(tiers):
    tier = tiers()
    tag = tiers.tag(tier)
    keys = np.array([0, -1, 1, 2**63 - 1, -(2**63) + 2, 2**32, -(2**32)], dtype=np.int64)
    emb = vectors(np.random.default_rng(4), keys.size)
    tier.insert(tag, keys, emb)
    got, found = tier.lookup(tag, keys[::-1])
    assert found.all()
    np.testing.assert_array_equal(got, emb[::-1])


def test_int32_keys_are_widened(tiers):
    tier = tiers()
    tag = tiers.tag(tier)
    emb = vectors(np.random.default_rng(5), 4)
    tier.insert(tag, np.array([1, 2, 3, -4], dtype=np.int32), emb)
    got, found = tier.lookup(tag, np.array([-4, 3], dtype=np.int64))
    assert found.all()
    np.testing.assert_array_equal(got, emb[[3, 2]])


@pytest.mark.parametrize("n", [1, 7, 8, 9, 15, 16, 17, 40])
def test_chunking_at_and_around_max_batch_size(tiers, n):
    tier = tiers(max_batch_size=8)
    tag = tiers.tag(tier)
    rng = np.random.default_rng(100 + n)
    keys, emb = distinct_keys(rng, n), vectors(rng, n)
    tier.insert(tag, keys, emb)
    query = np.concatenate([keys, keys[: n // 2] + 1])
    got, found = tier.lookup(tag, query)
    assert found[:n].all()
    np.testing.assert_array_equal(got[:n], emb)
    assert tier.size(tag) == n


def test_evict_removes_keys(tiers):
    tier = tiers()
    tag = tiers.tag(tier)
    rng = np.random.default_rng(6)
    keys, emb = distinct_keys(rng, 200), vectors(rng, 200)
    tier.insert(tag, keys, emb)
    assert tier.evict(tag, np.concatenate([keys[:50], [123456789]])) == 50
    _, found = tier.lookup(tag, keys)
    np.testing.assert_array_equal(found, np.arange(200) >= 50)
    assert tier.size(tag) == 150
    tier.insert(tag, keys[:10], emb[:10])  # evicted keys can come back
    got, found = tier.lookup(tag, keys[:10])
    assert found.all()
    np.testing.assert_array_equal(got, emb[:10])


def test_wrong_shape_is_rejected(tiers):
    tier = tiers()
    tag = tiers.tag(tier)
    with pytest.raises(InvalidInputError):
        tier.insert(tag, np.arange(3), np.zeros((3, DIM + 1), np.float32))
    with pytest.raises(InvalidInputError):
        tier.create_table(tag, DIM + 1)


def test_tables_are_independent_and_dropped(tiers):
    tier = tiers()
    a, b = tiers.tag(tier), tiers.tag(tier, dim=3)
    tier.insert(a, np.arange(5), np.ones((5, DIM), np.float32))
    tier.insert(b, np.arange(5), np.full((5, 3), 2, np.float32))
    assert tier.dim(b) == 3
    np.testing.assert_array_equal(tier.lookup(b, np.arange(5))[0], np.full((5, 3), 2))
    tier.drop_table(a)
    assert tier.size(a) == 0 and a not in tier.tables()
    assert tier.size(b) == 5


def test_data_survives_reopen(tiers):
    if not tiers.shared:
        pytest.skip(f"{tiers.kind} keeps its data in this process only")
    tier = tiers()
    tag = tiers.tag(tier)
    rng = np.random.default_rng(7)
    keys, emb = distinct_keys(rng, 100), vectors(rng, 100)
    tier.insert(tag, keys, emb)
    tier.close()
    again = tiers()
    again.create_table(tag, DIM)
    got, found = again.lookup(tag, keys)
    assert found.all()
    np.testing.assert_array_equal(got, emb)
    tiers._tags.append((again, tag))


def test_read_only_refuses_writes(tmp_path):
    from tierserve.ps.rocksdb_tier import RocksDBConfig, RocksDBTier

    path = str(tmp_path / "ro")
    with RocksDBTier(RocksDBConfig(path=path)) as writer:
        writer.create_table("hps_et.m.t", DIM)
        writer.insert("hps_et.m.t", np.arange(3), np.ones((3, DIM), np.float32))
    with RocksDBTier(RocksDBConfig(path=path, read_only=True)) as reader:
        assert reader.read_only
        got, found = reader.lookup("hps_et.m.t", np.arange(4))
        np.testing.assert_array_equal(found, [True, True, True, False])
        with pytest.raises(ReadOnlyError):
            reader.insert("hps_et.m.t", np.arange(3), np.ones((3, DIM), np.float32))
        with pytest.raises(ReadOnlyError):
            reader.evict("hps_et.m.t", np.arange(1))
        with pytest.raises(ReadOnlyError):
            reader.create_table("hps_et.m.other", DIM)


def test_large_batch_round_trip(tiers):
    """A realistic batch (26 x 1024 keys) including repeats, as a CTR request sends."""
    tier = tiers()
    tag = tiers.tag(tier, dim=16)
    rng = np.random.default_rng(8)
    keys = distinct_keys(rng, 20000)
    emb = vectors(rng, 20000, 16)
    tier.insert(tag, keys, emb)
    idx = rng.integers(0, 20000, 26 * 1024)
    got, found = tier.lookup(tag, keys[idx])
    assert found.all()
    np.testing.assert_array_equal(got, emb[idx])


# --- overflow handling on the volatile tiers ------------------------------------------------


def overflow_tier(factory, policy, margin=100, partitions=1, **extra):
    tier = factory(
        overflow_margin=margin,
        overflow_policy=policy,
        overflow_resolution_target=0.8,
        num_partitions=partitions,
        refresh_time_after_fetch=True,
        **extra,
    )
    return tier, factory.tag(tier)


def pause():
    time.sleep(0.002)  # Redis stamps accesses in microseconds; keep batches apart


def test_evict_oldest_drops_the_least_recently_used(volatile_tiers):
    tier, tag = overflow_tier(volatile_tiers, "evict_oldest")
    emb = np.ones((20, DIM), np.float32)
    for b in range(5):  # keys 0..99 in five batches, oldest first
        tier.insert(tag, np.arange(20 * b, 20 * b + 20), emb)
        pause()
    tier.lookup(tag, np.arange(0, 20))  # batch 0 becomes the most recently used
    pause()
    tier.insert(tag, np.array([1000]), emb[:1])  # 101 > 100: evict down to 80
    assert tier.size(tag) == 80
    _, found = tier.lookup(tag, np.arange(100))
    survivors = set(np.flatnonzero(found).tolist())
    assert set(range(20)) <= survivors, "recently read keys were evicted"
    assert not survivors & set(range(20, 40)), "the oldest batch must go first"
    assert tier.lookup(tag, np.array([1000]))[1].all()
    assert tier.stats.evictions == 21


def test_evict_least_used_drops_the_least_frequently_used(volatile_tiers):
    tier, tag = overflow_tier(volatile_tiers, "evict_least_used")
    tier.insert(tag, np.arange(100), np.ones((100, DIM), np.float32))
    for _ in range(3):
        tier.lookup(tag, np.arange(0, 60))
    tier.insert(tag, np.array([1000]), np.ones((1, DIM), np.float32))
    assert tier.size(tag) == 80
    _, found = tier.lookup(tag, np.arange(100))
    assert found[:60].all(), "frequently read keys were evicted"
    assert found[60:].sum() == 20 - int(tier.lookup(tag, np.array([1000]))[1][0])


def test_evict_random_keeps_the_bound(volatile_tiers):
    tier, tag = overflow_tier(volatile_tiers, "evict_random", margin=50)
    rng = np.random.default_rng(9)
    total = 0
    for _ in range(12):
        keys = distinct_keys(rng, 17)
        tier.insert(tag, keys, vectors(rng, 17))
        total += 17
        assert tier.size(tag) <= 50
    assert tier.stats.evictions == total - tier.size(tag)


@pytest.mark.parametrize("policy", ["evict_oldest", "evict_least_used", "evict_random"])
def test_after_eviction_each_partition_holds_at_most_margin_times_target(volatile_tiers, policy):
    partitions = 1 if volatile_tiers.kind == "hash_map" else 4
    tier, tag = overflow_tier(volatile_tiers, policy, margin=40, partitions=partitions)
    rng = np.random.default_rng(10)
    tier.insert(tag, distinct_keys(rng, 30 * partitions), vectors(rng, 30 * partitions))
    assert tier.stats.evictions == 0
    for _ in range(6):
        tier.insert(tag, distinct_keys(rng, 25 * partitions), vectors(rng, 25 * partitions))
        sizes = tier.partition_sizes(tag)
        assert max(sizes) <= 40
    assert tier.stats.evictions > 0
    # One more batch that overflows every partition: all are resolved to <= 40 * 0.8.
    tier.insert(tag, distinct_keys(rng, 200 * partitions), vectors(rng, 200 * partitions))
    assert max(tier.partition_sizes(tag)) <= 32
