"""The Kafka update source: its ``ps.json`` config (``update_source`` of type
``kafka_message_queue``) and the client settings every Kafka client of ours derives from it.

confluent-kafka is the client (extra ``kafka``); this module imports it only when a client is
made.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import model_validator

from tierserve.core.errors import require_extra

from .config_base import NonNegativeInt, PositiveInt, StrictModel, UpdateSourceType_t


class KafkaUpdateSourceConfig(StrictModel):
    """Apache Kafka brokers ``host[:port][;host[:port]...]`` that carry embedding updates."""

    type: Literal[UpdateSourceType_t.kafka_message_queue] = UpdateSourceType_t.kafka_message_queue
    brokers: str = "127.0.0.1:9092"
    metadata_refresh_interval_ms: PositiveInt = 500  # HugeCTR: 30000 (30 s to see a new topic)
    poll_timeout_ms: PositiveInt = 500
    receive_buffer_size: PositiveInt = 2000  # embedding rows, as HugeCTR counts them
    max_batch_size: PositiveInt = 1000
    failure_backoff_ms: NonNegativeInt = 50
    max_commit_interval: PositiveInt = 32

    @model_validator(mode="before")
    @classmethod
    def _hugectr_spelling(cls, data: Any) -> Any:
        """HugeCTR's name for ``receive_buffer_size`` is ``max_receive_buffer_size``."""
        if isinstance(data, dict) and "max_receive_buffer_size" in data:
            data = dict(data)
            value = data.pop("max_receive_buffer_size")
            if "receive_buffer_size" in data and data["receive_buffer_size"] != value:
                raise ValueError("give receive_buffer_size or max_receive_buffer_size, not both")
            data["receive_buffer_size"] = value
        return data


def confluent_kafka():
    """The ``confluent_kafka`` module (a clear error naming the extra when it is missing)."""
    return require_extra("confluent_kafka", "kafka", "Kafka online updates")


def bootstrap_servers(brokers: str) -> str:
    """HugeCTR's ``host:port;host:port`` list as Kafka's comma-separated one."""
    return ",".join(b.strip() for b in brokers.replace(";", ",").split(",") if b.strip())


def metadata_settings(config: KafkaUpdateSourceConfig) -> dict:
    """librdkafka's metadata settings from ``metadata_refresh_interval_ms``: a topic created
    after a consumer subscribed (a model's first update) is found within that interval."""
    refresh = int(config.metadata_refresh_interval_ms)
    return {
        "topic.metadata.refresh.interval.ms": refresh,
        # Cached metadata must outlive a refresh or two; librdkafka's default is 15 minutes.
        "metadata.max.age.ms": max(3 * refresh, 5000),
    }
