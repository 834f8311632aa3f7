"""Faults: a Redis Cluster node dies and comes back; lookups never fail because of it."""

from __future__ import annotations

import logging
import uuid

import numpy as np
import pytest
from polling import until
from ps_helpers import expected, write_model

from tierserve.core.errors import BackendUnavailableError
from tierserve.ps import HierarchicalParameterServer
from tierserve.ps.config import parse_ps_config
from tierserve.ps.redis_tier import value_hash

pytestmark = pytest.mark.slow

N = 3000


def cluster_server(tmp_path, redis_cluster, persistent: bool, **vol):
    name = f"m{uuid.uuid4().hex[:8]}"
    model = write_model(tmp_path, name, [(np.arange(N), 4)])
    config = parse_ps_config({
        "volatile_db": {"type": "redis_cluster", "address": redis_cluster.addresses,
                        "num_partitions": 6, "max_batch_size": 500, **vol},
        "persistent_db": ({"type": "rocks_db", "path": str(tmp_path / "rdb")} if persistent
                          else {"type": "disabled"}),
        "models": [model],
    })
    return HierarchicalParameterServer(config), name


def partitions_on_node(redis_cluster, storage, node, partitions=6):
    return [p for p in range(partitions)
            if redis_cluster.node_index_for_key(value_hash(storage, p)) == node]


def keys_of_partitions(parts, partitions=6):
    from tierserve.ps.partition import partition_of

    keys = np.arange(N)
    return np.isin(partition_of(keys, partitions), parts)


def test_killed_node_falls_through_to_rocksdb_then_recovers(tmp_path, redis_cluster, caplog):
    ps, name = cluster_server(tmp_path, redis_cluster, persistent=True,
                              cache_missed_embeddings=True)
    with ps:
        storage = ps.model(name).table("sparse_embedding1").storage
        dead = partitions_on_node(redis_cluster, storage, 0)
        assert dead, "node 0 serves none of the six partitions"
        on_dead = keys_of_partitions(dead)
        keys = np.arange(N)
        truth = expected(keys, 4)
        np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", keys), truth)
        vstats = ps.tier_stats()["volatile"]
        assert vstats.errors == 0 and vstats.hits == N
        try:
            redis_cluster.kill_node(0)
            with caplog.at_level(logging.WARNING):
                got = ps.lookup(name, "sparse_embedding1", keys)  # never raises
            np.testing.assert_array_equal(got, truth)  # the dead node's keys came from RocksDB
            assert vstats.errors >= 1
            assert any("failed" in r.getMessage() or "unavailable" in r.getMessage()
                       for r in caplog.records if r.levelno == logging.WARNING)
            assert ps.tier_stats()["persistent"].hits == int(on_dead.sum())
            for _ in range(3):  # more lookups while it is down: still no exception
                np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", keys), truth)
        finally:
            redis_cluster.restart_node(0)
        # The restarted node is empty (no persistence): misses are copied back up from
        # RocksDB (cache_missed_embeddings), after which every key is a volatile hit again.

        def reaches_node_again():
            before = vstats.hits
            ps.lookup(name, "sparse_embedding1", keys)
            return vstats.hits - before == N

        assert until(reaches_node_again), "lookups do not reach the restarted node"
        assert set(ps.volatile.breakers.states().values()) == {"closed"}
        np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", keys), truth)
        ps.unload_model(name)


def test_killed_node_gives_defaults_without_a_persistent_tier(tmp_path, redis_cluster, caplog):
    ps, name = cluster_server(tmp_path, redis_cluster, persistent=False)
    with ps:
        storage = ps.model(name).table("sparse_embedding1").storage
        dead = partitions_on_node(redis_cluster, storage, 1)
        on_dead = keys_of_partitions(dead)
        keys = np.arange(N)
        try:
            redis_cluster.kill_node(1)
            with caplog.at_level(logging.WARNING):
                got = ps.lookup(name, "sparse_embedding1", keys)
            np.testing.assert_array_equal(got[on_dead], -1)  # the table's default
            np.testing.assert_array_equal(got[~on_dead], expected(keys[~on_dead], 4))
            assert ps.tier_stats()["volatile"].errors >= 1
            assert any(r.levelno == logging.WARNING for r in caplog.records)
            # Writes to the dead node are refused with a retryable error.
            with pytest.raises(BackendUnavailableError) as info:
                ps.insert(name, "sparse_embedding1", keys[on_dead][:5], np.zeros((5, 4), np.float32))
            assert info.value.retryable
        finally:
            redis_cluster.restart_node(1)
        # Back, but empty: the keys it served read as defaults until they are written again.
        # Writes are refused (retryable) until the node's circuit lets a probe through.
        assert until(lambda: _insert(ps, name, keys[on_dead], expected(keys[on_dead], 4)))
        assert until(lambda: np.array_equal(
            ps.lookup(name, "sparse_embedding1", keys), expected(keys, 4)))
        ps.unload_model(name)


def _insert(ps, name, keys, embeddings) -> bool:
    """One try of a write, as a Kafka consumer retries it: False when refused as retryable."""
    try:
        ps.insert(name, "sparse_embedding1", keys, embeddings)
    except BackendUnavailableError:
        return False
    return True


def test_standalone_redis_behind_the_hierarchy(tmp_path, redis_server):
    name = f"m{uuid.uuid4().hex[:8]}"
    model = write_model(tmp_path, name, [(np.arange(500), 8)])
    config = parse_ps_config({
        "volatile_db": {"type": "redis", "address": redis_server.url, "num_partitions": 2,
                        "initial_cache_rate": 0.5, "cache_missed_embeddings": True},
        "persistent_db": {"type": "rocks_db", "path": str(tmp_path / "rdb")},
        "models": [model],
    })
    with HierarchicalParameterServer(config) as ps:
        storage = ps.model(name).table("sparse_embedding1").storage
        assert ps.volatile.size(storage) == 250
        keys = np.arange(600)
        got = ps.lookup(name, "sparse_embedding1", keys)
        np.testing.assert_array_equal(got[:500], expected(keys[:500], 8))
        np.testing.assert_array_equal(got[500:], -1)
        assert ps.volatile.size(storage) == 500
        ps.unload_model(name)
        assert ps.volatile.size(storage) == 0


def test_attach_to_an_existing_redis_without_reloading(tmp_path, redis_server):
    name = f"m{uuid.uuid4().hex[:8]}"
    model = write_model(tmp_path, name, [(np.arange(200), 4)])
    vol = {"type": "redis", "address": f"{redis_server.host}:{redis_server.port}",
           "num_partitions": 3}
    with HierarchicalParameterServer(parse_ps_config({"volatile_db": vol, "models": [model]})):
        pass  # loads the table into Redis and leaves it there
    for f in (tmp_path / name).rglob("*"):
        if f.is_file():
            f.unlink()  # attaching must not read the files
    attach = {**vol, "initialize_after_startup": False}
    config = parse_ps_config({"volatile_db": attach, "models": [model]})
    with HierarchicalParameterServer(config) as ps:
        np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", [3, 199, 500]),
                                      np.r_[expected([3, 199], 4), [[-1] * 4]])
        ps.unload_model(name)
