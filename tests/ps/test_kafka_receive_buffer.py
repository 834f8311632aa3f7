"""HugeCTR's ``max_receive_buffer_size`` counts embedding rows: once that many rows
have arrived they are handed on at once, without waiting out ``poll_timeout_ms``.  Through a
real Kafka broker."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
from polling import until
from ps_helpers import write_model

from tierserve.ps import HierarchicalParameterServer
from tierserve.ps.config import parse_ps_config
from tierserve.ps.kafka_apply import UpdateConsumer
from tierserve.ps.kafka_producer import UpdateProducer
from tierserve.ps.kafka_source import KafkaUpdateSourceConfig
from tierserve.ps.params import UpdateSourceParams

pytestmark = pytest.mark.kafka


def test_the_hugectr_spelling_names_the_same_setting():
    params = UpdateSourceParams(type="kafka_message_queue", max_receive_buffer_size=7)
    assert params.to_config().receive_buffer_size == 7
    config = KafkaUpdateSourceConfig.model_validate({"max_receive_buffer_size": 9})
    assert config.receive_buffer_size == 9


def test_rows_not_messages_fill_the_receive_buffer(kafka_broker, tmp_path):
    name = f"rb{uuid.uuid4().hex[:10]}"
    model = write_model(tmp_path / name, name, [(np.arange(100), 4)])
    ps = HierarchicalParameterServer(parse_ps_config({
        "volatile_db": {"type": "hash_map", "update_filters": [name]}, "models": [model]}))
    producer = UpdateProducer(kafka_broker.bootstrap, max_batch_size=10)
    keys = np.arange(40)
    producer.publish(name, "sparse_embedding1", keys, np.ones((40, 4), np.float32))  # 4 x 10
    producer.flush()
    # 15 rows fill the buffer: two messages; as messages, 15 would never arrive here
    config = KafkaUpdateSourceConfig(brokers=kafka_broker.bootstrap, poll_timeout_ms=10000,
                                     receive_buffer_size=15, metadata_refresh_interval_ms=500)
    consumer = UpdateConsumer(ps, config, "volatile")
    consumer._consumer.subscribe([consumer.pattern])
    try:
        took: list[float] = []

        def received() -> bool:
            started = time.monotonic()
            got = consumer._receive(config.poll_timeout_ms / 1000)
            took.append(time.monotonic() - started)
            return bool(got)

        until(received, timeout=120)
        # not the poll timeout: half of it leaves a loaded machine room
        assert took[-1] < 5.0, f"waited {took[-1]:.1f} s with 40 rows there (poll timeout 10 s)"
    finally:
        consumer._consumer.close()
        ps.close()
