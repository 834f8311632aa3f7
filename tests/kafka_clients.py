"""Raw confluent-kafka clients, for tests that write what UpdateProducer never would."""

from __future__ import annotations

import logging


def raw_producer(bootstrap: str):
    """A plain ``confluent_kafka.Producer`` whose librdkafka lines go to Python logging, not
    stderr (a test that checks stderr is not disturbed by another test's producer when the
    shared broker stops)."""
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "logger": logging.getLogger("tests.kafka")})


def _admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, "logger": logging.getLogger("tests.kafka")})


def create_topic(broker, topic: str, partitions: int = 1) -> None:
    """Create ``topic`` on ``broker`` (a tests/services KafkaBroker) and wait for it."""
    from confluent_kafka.admin import NewTopic

    admin = _admin(broker.bootstrap)  # kept until the result came: its destruction cancels it
    admin.create_topics([NewTopic(topic, partitions, replication_factor=1)])[topic].result(30)


def delete_topic(broker, topic: str) -> None:
    """Delete ``topic`` and wait until the broker no longer lists it."""
    from polling import until

    admin = _admin(broker.bootstrap)
    admin.delete_topics([topic])[topic].result(30)
    assert until(lambda: topic not in admin.list_topics(timeout=5).topics, timeout=30)
