"""A topic deleted and created again under a running consumer, after a broker restart.

A broker of the test's own is restarted once (its partitions' leader epochs go up), then the
topic is deleted and created again (the new partition starts over at epoch 0 and offset 0).
librdkafka keeps the higher epoch it saw and ignores the new partition's metadata as stale,
so the consumer would never fetch from it; the consumer must notice the new topic (its id
changed) and read it from its start.
"""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
from kafka_clients import create_topic, delete_topic
from polling import until
from ps_helpers import write_model

from tierserve.ps import HierarchicalParameterServer
from tierserve.ps.config import parse_ps_config
from tierserve.ps.kafka_apply import UpdateConsumer
from tierserve.ps.kafka_producer import UpdateProducer
from tierserve.ps.kafka_source import KafkaUpdateSourceConfig
from tierserve.ps.table_tag import table_tag

pytestmark = [pytest.mark.kafka, pytest.mark.slow]
DIM = 4
TABLE = "sparse_embedding1"
#: How soon after the recreated topic's update is published it must be applied.
APPLIED_WITHIN_S = 15.0


def publish(broker, name: str, keys, vectors, messages: int = 1) -> None:
    with UpdateProducer(broker.bootstrap, max_batch_size=-(-len(keys) // messages)) as producer:
        producer.publish(name, TABLE, keys, vectors)


def _ps(tmp_path, name) -> HierarchicalParameterServer:
    model = write_model(tmp_path / name, name, [(np.arange(100), DIM)])
    return HierarchicalParameterServer(
        parse_ps_config({
            "volatile_db": {"type": "hash_map", "update_filters": [name]},
            "persistent_db": {"type": "disabled"},
            "models": [model],
        })
    )  # fmt: skip


def _vectors(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)


def test_a_topic_recreated_after_a_broker_restart_is_read_from_its_start(
    tmp_path, kafka_broker_factory
):
    broker = kafka_broker_factory()
    name = f"m{uuid.uuid4().hex[:10]}"
    topic = table_tag(name, TABLE)
    create_topic(broker, topic)
    ps = _ps(tmp_path, name)
    config = KafkaUpdateSourceConfig(
        brokers=broker.bootstrap, poll_timeout_ms=100, metadata_refresh_interval_ms=500,
        max_commit_interval=1,
    )  # fmt: skip
    consumer = UpdateConsumer(ps, config, "volatile", replica=f"r{uuid.uuid4().hex[:8]}").start()
    keys = np.arange(10, dtype=np.int64)

    def serves(vectors) -> bool:
        return np.array_equal(ps.lookup(name, TABLE, keys), vectors)

    try:
        # Twenty messages before the restart, one after: the consumer's offset is 21.
        first = _vectors(1, keys.size)
        publish(broker, name, keys, first, messages=10)
        publish(broker, name, keys, first, messages=10)
        assert until(lambda: serves(first), timeout=30)
        broker.stop()
        broker.start()
        second = _vectors(2, keys.size)
        publish(broker, name, keys, second)
        assert until(lambda: serves(second), timeout=60), "not applied after the restart"
        old_epochs = consumer.stats.messages

        delete_topic(broker, topic)
        create_topic(broker, topic)
        third = _vectors(3, keys.size)
        publish(broker, name, keys, third, messages=2)  # offsets 0 and 1 of the new topic
        published = time.monotonic()
        applied = until(lambda: serves(third), timeout=APPLIED_WITHIN_S)
        status = consumer.status()
        assert applied, (
            f"the recreated topic's updates were never applied ({consumer.stats}, {status})"
        )
        print(f"recreated topic's update applied {time.monotonic() - published:.2f} s after "
              f"it was published")  # fmt: skip
        assert consumer.stats.messages >= old_epochs + 2
        assert status.alive and consumer.stats.errors == 0
        # And the consumer goes on reading it.
        fourth = _vectors(4, keys.size)
        publish(broker, name, keys, fourth)
        assert until(lambda: serves(fourth), timeout=APPLIED_WITHIN_S)
    finally:
        consumer.close()
        ps.close()

