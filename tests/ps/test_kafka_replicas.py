"""Replicas and online updates: each server process is its own replica, tiers say whether
they are shared, and every replica's listeners (its embedding caches) hear of every update
to a shared tier, after the tier holds it.  Through a real Redis and a real Kafka broker."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import uuid

import numpy as np
import pytest
from polling import until
from ps_helpers import expected, write_model

from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.ps import HierarchicalParameterServer
from tierserve.ps.config import parse_ps_config
from tierserve.ps.kafka_groups import REPLICA_ENV, replica_id
from tierserve.ps.kafka_invalidate import InvalidationConsumer
from tierserve.ps.kafka_producer import UpdateProducer
from tierserve.ps.kafka_source import KafkaUpdateSourceConfig
from tierserve.ps.kafka_updates import start_update_consumers

DIM = 4
TABLE = "sparse_embedding1"  # write_model's table name
_PRINT_ID = "from tierserve.ps.kafka_groups import replica_id; print(replica_id(), replica_id())"


def _replica_id(env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _PRINT_ID], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    first, again = out.stdout.split()
    assert first == again  # one id per process
    return first


def test_each_process_is_its_own_replica_unless_configured(monkeypatch):
    env = {k: v for k, v in os.environ.items() if k != REPLICA_ENV}
    a, b = _replica_id(env), _replica_id(env)
    assert a != b  # two servers on one host: two replicas
    assert a.startswith(socket.gethostname().split(".")[0])
    assert _replica_id({**env, REPLICA_ENV: "pod-7"}) == "pod-7"
    monkeypatch.setenv(REPLICA_ENV, "two words")
    with pytest.raises(ConfigError, match=REPLICA_ENV):
        replica_id()


def test_tiers_say_whether_they_are_shared_and_read_only(tmp_path, redis_server):
    from tierserve.ps.hash_map import HashMapConfig
    from tierserve.ps.redis_tier import RedisConfig
    from tierserve.ps.rocksdb_tier import RocksDBConfig
    from tierserve.ps.tier_registry import create_tier

    path = str(tmp_path / "rdb")
    with create_tier(RocksDBConfig(path=path)) as rdb:
        assert not rdb.shared and not rdb.read_only
    with create_tier(RocksDBConfig(path=path, read_only=True)) as rdb:
        assert rdb.read_only
    with create_tier(HashMapConfig()) as hm:
        assert not hm.shared and not hm.read_only
    with create_tier(RedisConfig(address=redis_server.url)) as redis:
        assert redis.shared and not redis.read_only


def _ps(tmp_path, name, redis_server, attach: bool) -> HierarchicalParameterServer:
    model = write_model(tmp_path / name, name, [(np.arange(50), DIM)])
    volatile = {"type": "redis", "address": redis_server.url, "num_partitions": 2,
                "update_filters": [name], "initialize_after_startup": not attach}  # fmt: skip
    return HierarchicalParameterServer(
        parse_ps_config(
            {"volatile_db": volatile, "persistent_db": {"type": "disabled"}, "models": [model]}
        )  # fmt: skip
    )


class _Listener:
    """Records each notification and what a lookup returned at that moment."""

    def __init__(self, ps, name: str) -> None:
        self.ps, self.name = ps, name
        self.calls: list[tuple[np.ndarray, object, np.ndarray]] = []
        self._lock = threading.Lock()

    def __call__(self, model, table, keys, embeddings) -> None:
        if model != self.name:
            return
        seen = self.ps.lookup(model, table, keys)
        with self._lock:
            self.calls.append((np.asarray(keys), embeddings, seen))


def test_every_replica_hears_of_an_update_to_a_shared_tier(tmp_path, redis_server, kafka_broker):
    # Two replicas over one Redis: one consumer group applies each update once, so before
    # the invalidation consumers only the replica that applied it told its caches.
    name = f"m{uuid.uuid4().hex[:10]}"
    config = KafkaUpdateSourceConfig(
        brokers=kafka_broker.bootstrap, poll_timeout_ms=100, metadata_refresh_interval_ms=500,
        max_commit_interval=1,
    )  # fmt: skip
    with UpdateProducer(kafka_broker.bootstrap) as producer:  # the topic exists from here
        producer.publish(name, TABLE, [0], expected([0], DIM))
    replicas = [_ps(tmp_path / "a", name, redis_server, attach=False)]
    replicas.append(_ps(tmp_path / "b", name, redis_server, attach=True))
    listeners = [_Listener(ps, name) for ps in replicas]
    consumers = []
    try:
        for i, (ps, listener) in enumerate(zip(replicas, listeners)):
            ps.add_update_listener(listener)
            consumers.append(start_update_consumers(ps, config, replica=f"{name}-r{i}"))
        roles = [sorted(c.role for c in cs) for cs in consumers]
        assert roles == [["apply", "invalidate"]] * 2
        assert {c.group for cs in consumers for c in cs if c.role == "apply"} == {"hps.volatile"}
        keys = np.array([3, 4, 60], np.int64)
        new = np.full((3, DIM), 8.25, np.float32)
        with UpdateProducer(kafka_broker.bootstrap) as producer:
            producer.publish(name, TABLE, keys, new)

        def heard(listener) -> bool:
            return any(np.isin(keys, k).all() for k, _, _ in list(listener.calls))

        assert until(lambda: all(heard(x) for x in listeners), timeout=30), [
            len(x.calls) for x in listeners
        ]
        for listener in listeners:
            for k, _, seen in listener.calls:
                if np.isin(keys, k).all():
                    # Heard only once the shared tier held the update: a cache that drops
                    # the keys then reads the new vectors.
                    np.testing.assert_array_equal(seen[np.searchsorted(k, keys)], new)
        for ps in replicas:
            np.testing.assert_array_equal(ps.lookup(name, TABLE, keys), new)
        assert all(c.status().alive for cs in consumers for c in cs)
    finally:
        for cs in consumers:
            for c in cs:
                c.close()
        for ps in replicas:
            ps.close()


def test_an_unshared_tier_has_no_invalidation_consumer(tmp_path, kafka_broker):
    name = f"m{uuid.uuid4().hex[:10]}"
    model = write_model(tmp_path, name, [(np.arange(5), DIM)])
    config = KafkaUpdateSourceConfig(brokers=kafka_broker.bootstrap)
    with HierarchicalParameterServer(
        parse_ps_config(
            {
                "volatile_db": {"type": "hash_map", "update_filters": [name]},
                "persistent_db": {"type": "disabled"},
                "models": [model],
            }
        )  # fmt: skip
    ) as ps:
        consumers = start_update_consumers(ps, config)
        try:
            assert [c.role for c in consumers] == ["apply"]
            assert consumers[0].group == f"hps.volatile.{replica_id()}"
        finally:
            for c in consumers:
                c.close()
        with pytest.raises(InvalidInputError, match="not shared"):
            InvalidationConsumer(ps, config, "volatile")
