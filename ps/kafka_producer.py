"""Publishing embedding updates to Kafka (DESIGN: docs/formats.md, the update message).

:class:`UpdateProducer` publishes one topic per table tag ``hps_et.<model>.<table>``, with
an empty message key and values of at most ``max_batch_size`` records
(:mod:`tierserve.ps.update_message`); the consumers of :mod:`tierserve.ps.kafka_updates`
apply them.
"""

from __future__ import annotations

import numpy as np

from tierserve.core.errors import BackendUnavailableError, InvalidInputError

from .kafka_log import KafkaLog
from .kafka_source import bootstrap_servers, confluent_kafka
from .table_tag import table_tag
from .update_message import encode_update


class UpdateProducer:
    """Publishes embedding updates to the topics the consumers read."""

    def __init__(self, brokers: str, max_batch_size: int = 1000, **options) -> None:
        if max_batch_size <= 0:
            raise InvalidInputError(f"max_batch_size must be positive, got {max_batch_size}")
        self.max_batch_size = int(max_batch_size)
        self.kafka_log = KafkaLog("kafka updates (producer)")
        self._producer = confluent_kafka().Producer(
            {"bootstrap.servers": bootstrap_servers(brokers), **self.kafka_log.client_config(), **options}
        )
        self.brokers = brokers
        self._failed: list[str] = []
        self.delivered = 0  # messages the brokers acknowledged

    def publish(
        self, model: str, table: str, keys, embeddings, *, timestamp_ms: int | None = None
    ) -> int:
        """Queue the update of ``keys`` of ``model``'s ``table``; returns the messages queued.

        ``timestamp_ms`` (default: now) is the messages' time: when the rows were taken.
        Consumers skip updates older than the files of the version they serve
        (:mod:`tierserve.ps.update_replay`).
        """
        topic = table_tag(model, table)
        keys = np.asarray(keys)
        embeddings = np.asarray(embeddings, dtype=np.float32)
        sent = 0
        for start in range(0, keys.shape[0], self.max_batch_size):
            end = start + self.max_batch_size
            value = encode_update(keys[start:end], embeddings[start:end])
            self._produce(topic, value, timestamp_ms)
            sent += 1
        return sent

    def _produce(self, topic: str, value: bytes, timestamp_ms: int | None = None) -> None:
        extra = {} if timestamp_ms is None else {"timestamp": int(timestamp_ms)}
        while True:
            try:
                self._producer.produce(topic, value=value, on_delivery=self._delivered, **extra)
                return
            except BufferError:  # the local queue is full: let deliveries drain it
                self._producer.poll(0.1)

    def _delivered(self, error, message) -> None:
        if error is not None:
            self._failed.append(f"{message.topic()}: {error}")
            return
        self.delivered += 1
        if self.kafka_log.down:
            self.kafka_log.recovered()

    def poll(self, timeout: float = 0.0) -> None:
        """Serve delivery reports and log lines, waiting at most ``timeout`` seconds."""
        self._producer.poll(timeout)

    @property
    def failed(self) -> int:
        """Messages whose delivery failed, reported since the last :meth:`take_failures`."""
        return len(self._failed)

    def take_failures(self) -> list[str]:
        """The delivery failures reported since the last call (``topic: error``)."""
        failed, self._failed = self._failed, []
        return failed

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued update is delivered; raise if any failed or timed out."""
        left = self._producer.flush(timeout)
        failed, self._failed = self._failed, []
        if failed:
            raise BackendUnavailableError(
                f"{len(failed)} update messages failed ({'; '.join(failed[:3])}"
                f"{', ...' if len(failed) > 3 else ''})"
                + (f", {left} more undelivered after {timeout:g} s" if left else "")
            )
        if left:
            raise BackendUnavailableError(
                f"{left} update messages undelivered after {timeout:g} s: no Kafka broker "
                f"at {self.brokers} acknowledged them (is it running and reachable?)"
            )

    def close(self, timeout: float = 30.0) -> None:
        self.flush(timeout)

    def __enter__(self) -> UpdateProducer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
