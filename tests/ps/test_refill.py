"""A Redis server or cluster node restarted without persistence is refilled in the background."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
from polling import until
from ps_helpers import expected, write_model

from tierserve.ps import HierarchicalParameterServer
from tierserve.ps.config import parse_ps_config
from tierserve.ps.partition import partition_of
from tierserve.ps.redis_tier import value_hash

pytestmark = pytest.mark.slow

N = 2000
REFILL = {"refill_interval_ms": 100, "failure_backoff_ms": 100, "max_failure_backoff_ms": 200}


def _server(tmp_path, volatile: dict, persistent: bool, updates: bool = False):
    name = f"m{uuid.uuid4().hex[:8]}"
    model = write_model(tmp_path, name, [(np.arange(N), 4)])
    config = parse_ps_config({
        "volatile_db": {**volatile, **REFILL},
        "persistent_db": ({"type": "rocks_db", "path": str(tmp_path / "rdb")} if persistent
                          else {"type": "disabled"}),
        "models": [model],
    })  # fmt: skip
    return HierarchicalParameterServer(config), name


def test_restarted_empty_redis_is_refilled_from_rocksdb(tmp_path, redis_server_factory):
    redis = redis_server_factory()  # no persistence: a restart comes back empty
    ps, name = _server(
        tmp_path, {"type": "redis", "address": redis.address, "num_partitions": 4}, True
    )
    with ps:
        storage = ps.model(name).table("sparse_embedding1").storage
        keys = np.arange(N)
        # An online update reached both tiers: the refill must bring back the new vector.
        ps.insert(name, "sparse_embedding1", keys[:10], np.full((10, 4), 7.0, np.float32))
        truth = expected(keys, 4)
        truth[:10] = 7.0
        redis.stop()
        redis.start()  # empty
        # the refill counts its keys after writing them: wait for the count, not only the size
        assert until(lambda: ps.volatile.stats.refilled == N, timeout=15), "never refilled"
        assert ps.volatile.size(storage) == N
        before = ps.tier_stats()["persistent"].hits
        np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", keys), truth)
        assert ps.tier_stats()["persistent"].hits == before  # all from Redis again
        ps.unload_model(name)


def test_restarted_empty_redis_is_refilled_from_the_model_files(tmp_path, redis_server_factory):
    redis = redis_server_factory()
    ps, name = _server(
        tmp_path, {"type": "redis", "address": redis.address, "num_partitions": 3}, False
    )
    with ps:
        storage = ps.model(name).table("sparse_embedding1").storage
        keys = np.arange(N + 5)
        truth = np.concatenate([expected(keys[:N], 4), np.full((5, 4), -1, np.float32)])
        redis.stop()
        redis.start()
        assert until(lambda: ps.volatile.stats.refilled == N, timeout=15), "never refilled"
        assert ps.volatile.size(storage) == N
        np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", keys), truth)
        refilled = ps.volatile.stats.refilled
        # Nothing more is written while the marks stay.
        assert not until(lambda: ps.volatile.stats.refilled != refilled, timeout=0.5)
        ps.unload_model(name)


def test_restarted_cluster_node_gets_back_only_its_partitions(tmp_path, redis_cluster):
    volatile = {"type": "redis_cluster", "address": redis_cluster.addresses, "num_partitions": 6}
    ps, name = _server(tmp_path, volatile, True)
    with ps:
        storage = ps.model(name).table("sparse_embedding1").storage
        node = 2
        parts = [
            p for p in range(6) if redis_cluster.node_index_for_key(value_hash(storage, p)) == node
        ]
        assert parts, "node 2 serves none of the six partitions"
        on_node = int(np.isin(partition_of(np.arange(N), 6), parts).sum())
        try:
            redis_cluster.kill_node(node)
        finally:
            redis_cluster.restart_node(node)
        assert until(lambda: ps.volatile.stats.refilled == on_node, timeout=20), "never refilled"
        assert ps.volatile.size(storage) == N
        keys = np.arange(N)
        np.testing.assert_array_equal(ps.lookup(name, "sparse_embedding1", keys), expected(keys, 4))
        ps.unload_model(name)


def test_no_refill_when_the_server_does_not_fill_redis(tmp_path, redis_server_factory):
    redis = redis_server_factory()
    vol = {"type": "redis", "address": redis.address, "num_partitions": 2}
    ps, name = _server(tmp_path, vol, False)
    ps.close()  # leaves the table in Redis
    model = write_model(tmp_path, name, [(np.arange(N), 4)])
    config = parse_ps_config({
        "volatile_db": {**vol, **REFILL, "initialize_after_startup": False}, "models": [model],
    })  # fmt: skip
    with HierarchicalParameterServer(config) as attached:
        storage = attached.model(name).table("sparse_embedding1").storage
        assert attached.volatile.size(storage) == N
        redis.stop()
        redis.start()
        # HugeCTR's initialize_after_startup false: another process fills this Redis.
        assert not until(lambda: attached.volatile.size(storage) > 0, timeout=1.0)
        assert attached.volatile.stats.refilled == 0
