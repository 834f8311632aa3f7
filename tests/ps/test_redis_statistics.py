"""The Redis tier's per-partition statistics hash (``hps_et{<tag>/pN}t``): written only when
an overflow margin with an access-based policy, or a TTL, reads it (ps/redis_tier.py)."""

from __future__ import annotations

import uuid

import numpy as np
import pytest

from tierserve.ps.redis_tier import RedisConfig, stat_hash, value_hash
from tierserve.ps.tier_registry import create_tier

DIM = 4


@pytest.fixture
def tag():
    return f"hps_et.stats{uuid.uuid4().hex[:8]}.t"  # unique on the shared Redis


def _tier(server, **extra):
    return create_tier(RedisConfig(address=server.url, num_partitions=1, **extra))


def _rows(lo: int, hi: int):
    keys = np.arange(lo, hi, dtype=np.int64)
    return keys, np.full((keys.size, DIM), float(lo), np.float32)


@pytest.mark.parametrize("settings", [
    {},  # evict_oldest (the default) without a margin: nothing is ever evicted
    {"overflow_policy": "evict_least_used", "refresh_time_after_fetch": True},
    {"overflow_policy": "evict_random", "overflow_margin": 100},
])  # fmt: skip
def test_no_statistics_hash_when_nothing_reads_it(redis_server, tag, settings):
    client = redis_server.client()
    with _tier(redis_server, **settings) as tier:
        tier.create_table(tag, DIM)
        try:
            tier.load_table(tag, *_rows(0, 60))
            tier.insert(tag, *_rows(60, 120))
            assert tier.lookup(tag, np.arange(0, 120))[1].sum() == tier.size(tag)
            assert client.exists(value_hash(tag, 0))
            assert not client.exists(stat_hash(tag, 0))
            if "overflow_margin" in settings:  # evict_random still evicts
                assert tier.size(tag) == 80
        finally:
            tier.drop_table(tag)


def test_evict_oldest_with_a_margin_keeps_times_and_evicts_the_oldest(redis_server, tag):
    client = redis_server.client()
    with _tier(redis_server, overflow_margin=100, overflow_policy="evict_oldest") as tier:
        tier.create_table(tag, DIM)
        try:
            tier.insert(tag, *_rows(0, 60))
            assert client.hlen(stat_hash(tag, 0)) == 60
            tier.insert(tag, *_rows(60, 120))  # 120 > 100: back to 80, the oldest going
            assert tier.size(tag) == 80
            assert tier.contains(tag, np.arange(60, 120)).all()
            assert tier.contains(tag, np.arange(0, 60)).sum() == 20
        finally:
            tier.drop_table(tag)


def test_rows_written_without_times_are_evicted_first(redis_server, tag):
    """A table filled by a tier without a margin, then written by one with evict_oldest:
    the rows that carry no time count as the oldest."""
    with _tier(redis_server) as plain, _tier(
        redis_server, overflow_margin=100, overflow_policy="evict_oldest"
    ) as bounded:
        plain.create_table(tag, DIM)
        bounded.create_table(tag, DIM)
        try:
            plain.insert(tag, *_rows(0, 60))
            bounded.insert(tag, *_rows(60, 120))
            assert bounded.size(tag) == 80
            assert bounded.contains(tag, np.arange(60, 120)).all()
        finally:
            bounded.drop_table(tag)
