"""Raw confluent-kafka clients, for tests that write what UpdateProducer never would."""

from __future__ import annotations

import logging


def raw_producer(bootstrap: str):
    """A plain ``confluent_kafka.Producer`` whose librdkafka lines go to Python logging, not
    stderr (a test that checks stderr is not disturbed by another test's producer when the
    shared broker stops)."""
    from confluent_kafka import Producer

    return Producer({"bootstrap.servers": bootstrap, "logger": logging.getLogger("tests.kafka")})
