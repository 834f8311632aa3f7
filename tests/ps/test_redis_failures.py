"""A frozen Redis (SIGSTOP): timeouts and retries from ps.json, and the circuit breaker."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import numpy as np
import pytest
from frozen import frozen
from polling import until
from ps_helpers import expected, write_model

from tierserve.core.errors import BackendUnavailableError
from tierserve.ps import HierarchicalParameterServer
from tierserve.ps.config import parse_ps_config
from tierserve.ps.redis_tier import RedisClusterConfig, RedisConfig
from tierserve.ps.tier_registry import create_tier

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def own_redis(redis_server_factory):
    """A Redis of this module's own, so freezing it stops no other test."""
    return redis_server_factory()


def _tier(server, **settings):
    tier = create_tier(RedisConfig(address=server.address, num_partitions=2, **settings))
    tag = f"hps_et.t{uuid.uuid4().hex[:10]}.emb"
    tier.create_table(tag, 4)
    keys = np.arange(100, dtype=np.int64)
    tier.insert(tag, keys, expected(keys, 4))
    return tier, tag, keys


def _timed_lookup(tier, tag, keys):
    started = time.monotonic()
    _, found = tier.lookup(tag, keys)
    return time.monotonic() - started, found


def test_socket_timeout_and_retries_come_from_the_config(own_redis):
    tier, tag, keys = _tier(
        own_redis, socket_timeout_ms=300, connect_timeout_ms=250, max_retries=2,
        failure_threshold=100,
    )  # fmt: skip
    with tier:
        kwargs = tier._client.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == 0.3 and kwargs["socket_connect_timeout"] == 0.25
        with frozen(own_redis):
            took, found = _timed_lookup(tier, tag, keys)
        # Three tries of 0.3 s (and 10 + 20 ms between them), never the old fixed 5 s (the
        # upper bound leaves a loaded machine room; one try of the old timeout is 5 s).
        assert not found.any()
        assert 0.85 < took < 4.0, took
        assert tier.stats.errors == 1
        took, found = _timed_lookup(tier, tag, keys)
        assert found.all() and took < 0.3
        tier.drop_table(tag)


def test_cluster_nodes_get_the_timeouts(redis_cluster):
    config = RedisClusterConfig(
        address=redis_cluster.addresses, socket_timeout_ms=700, connect_timeout_ms=400
    )
    with create_tier(config) as tier:
        node = tier._client.get_nodes()[0]
        kwargs = tier._client.get_redis_connection(node).connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == 0.7 and kwargs["socket_connect_timeout"] == 0.4


def test_a_frozen_node_is_skipped_after_the_threshold_then_probed(own_redis):
    tier, tag, keys = _tier(
        own_redis, socket_timeout_ms=200, failure_threshold=2, failure_backoff_ms=600,
        max_failure_backoff_ms=600,
    )  # fmt: skip
    with tier:
        breaker = tier.breakers["standalone"]
        with frozen(own_redis):
            for _ in range(2):  # two timeouts in a row open the circuit
                took, found = _timed_lookup(tier, tag, keys)
                assert took >= 0.19 and not found.any()
            assert breaker.state == "open" and tier.stats.errors == 2
            _, found = tier.lookup(tag, keys)
            # skipped: not asked at all (asked, it would have timed out: a third error)
            assert not found.any()
            assert tier.stats.skipped == keys.size and tier.stats.errors == 2
            assert tier.stats.misses == 3 * keys.size
            # After the back-off one lookup probes (and waits); one beside it still skips.
            time.sleep(0.65)  # the 600 ms back-off passing is the behaviour
            probe = threading.Thread(target=tier.lookup, args=(tag, keys))
            probe.start()
            assert until(lambda: breaker.state == "half_open", timeout=2)
            _, found = tier.lookup(tag, keys)
            assert not found.any()
            probe.join()
            # the probe's timeout is the one new error: the lookup beside it asked nothing
            assert breaker.state == "open" and tier.stats.errors == 3
            # Writes to a skipped node fail at once with a retryable error (sent, they would
            # have timed out: a new error).
            with pytest.raises(BackendUnavailableError, match="skipped after repeated failures"):
                tier.insert(tag, keys[:3], expected(keys[:3], 4))
            with pytest.raises(BackendUnavailableError, match="skipped"):
                tier.evict(tag, keys[:3])
            assert tier.stats.errors == 3
        # Thawed: after the back-off the next lookup's probe succeeds and closes the circuit.
        assert until(lambda: tier.lookup(tag, keys)[1].all(), timeout=5)
        assert breaker.state == "closed"
        tier.drop_table(tag)


@pytest.mark.parametrize("cache_missed", [False, True])
def test_hierarchy_falls_through_to_rocksdb_while_redis_is_skipped(
    tmp_path, own_redis, cache_missed, caplog
):
    name = f"m{uuid.uuid4().hex[:8]}"
    model = write_model(tmp_path, name, [(np.arange(400), 4)])
    config = parse_ps_config({
        "volatile_db": {"type": "redis", "address": own_redis.address, "num_partitions": 2,
                        "socket_timeout_ms": 200, "failure_threshold": 1,
                        "failure_backoff_ms": 60000, "max_failure_backoff_ms": 60000,
                        "cache_missed_embeddings": cache_missed},
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rdb")},
        "models": [model],
    })  # fmt: skip
    keys = np.arange(450)
    truth = expected(keys, 4)
    truth[400:] = -1  # the table's default
    with HierarchicalParameterServer(config) as ps, caplog.at_level(logging.WARNING):
        with frozen(own_redis):
            np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", keys), truth)
            for _ in range(5):
                got = ps.lookup(name, "sparse_embedding1", keys)
                np.testing.assert_array_equal(got, truth)
            # No timeouts: the tier is skipped (so is copying the misses up into it); the
            # one error below is the lookup that opened the circuit.
        stats = ps.tier_stats()
        # One real failure (the lookup that timed out and opened the circuit), whether or
        # not misses are copied up: a copy-up refused by the open circuit is no new error.
        assert stats["volatile"].errors == 1
        assert stats["volatile"].skipped == 5 * keys.size
        assert stats["persistent"].hits == 6 * 400
        assert "could not cache missed embeddings" not in caplog.text  # not once per request
        ps.unload_model(name)


def test_bad_failure_settings_are_refused_by_name():
    from tierserve.core.errors import ConfigError

    with pytest.raises(ConfigError, match="max_failure_backoff_ms"):
        parse_ps_config({"volatile_db": {"type": "redis", "failure_backoff_ms": 5000,
                                         "max_failure_backoff_ms": 1000}})  # fmt: skip
    for field, value in (("max_retries", -1), ("socket_timeout_ms", 0),
                         ("failure_threshold", 0), ("refill_interval_ms", -5)):  # fmt: skip
        with pytest.raises(ConfigError, match=field):
            parse_ps_config({"volatile_db": {"type": "redis_cluster", field: value}})
    with pytest.raises(ConfigError, match="socket_timeout_ms"):  # Redis settings only
        parse_ps_config({"volatile_db": {"type": "hash_map", "socket_timeout_ms": 100}})
