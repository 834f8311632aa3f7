"""What an update consumer's loop takes from its Kafka client, and how it reads a message.

:func:`receive` hands on the messages that arrive within the poll timeout, or sooner once
they hold ``receive_buffer_size`` embedding rows; :func:`decode` makes an :class:`Update` of
a message (or counts and logs an error or a malformed value); :func:`merged` joins a run of
updates of one table for one insert.  The loop itself is :mod:`tierserve.ps.kafka_consumer`.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

import numpy as np

from .kafka_source import confluent_kafka
from .update_message import announced_records, decode_update

log = logging.getLogger("tierserve.ps.kafka_consumer")  # the loop's log, as before the split

#: Bytes of a skipped message's value shown (in hex) in the log.
_LOG_BYTES = 32
_MAX_CONSUME = 100_000  # messages per consume() call (librdkafka takes at most 1,000,000)


class Update(NamedTuple):
    """One decoded update message."""

    message: Any
    topic: str
    dim: int
    keys: np.ndarray
    embeddings: np.ndarray


def hex_head(value) -> str:
    """The first bytes of a message value in hex, for logs (binary is never logged raw)."""
    if value is None:
        return "no value"
    head = bytes(value[:_LOG_BYTES]).hex()
    return f"{len(value)} bytes: {head}{'...' if len(value) > _LOG_BYTES else ''}"


def message_rows(message) -> int:
    """The embedding rows a message announces (1 for an error): what the receive buffer
    counts."""
    return announced_records(message.value() if message.error() is None else None)


def message_id(message) -> tuple[str, int, int]:
    return (message.topic(), message.partition(), message.offset())


def receive(consumer, timeout: float, limit: int) -> list:
    """The messages that arrive within ``timeout`` seconds, or fewer: as soon as they hold
    ``limit`` embedding rows (``receive_buffer_size``: HugeCTR's ``max_receive_buffer_size``
    counts rows, not messages), they are handed on without waiting out the timeout."""
    deadline = time.monotonic() + timeout
    messages: list = []
    rows = 0
    while rows < limit:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        first = consumer.poll(left)  # waits for one message at most
        if first is None:
            break
        # Then what the client already holds, without waiting (each message holds at
        # least one row, so at most limit - rows more are needed).
        wanted = min(max(limit - rows - 1, 1), _MAX_CONSUME)
        batch = [first, *consumer.consume(wanted, 0)]
        messages.extend(batch)
        rows += sum(message_rows(m) for m in batch)
    return messages


def decode(message, stats, kafka_log, level: str) -> Update | None:
    """The update a message carries, or None (counted in ``stats``; a client error told to
    ``kafka_log``) for an error or a malformed value; ``level`` names the tier in logs."""
    error = message.error()
    if error is not None:
        codes = confluent_kafka().KafkaError
        if error.code() == codes.UNKNOWN_TOPIC_OR_PART:
            # No topic matches the subscription yet (no update was ever published): the
            # metadata refresh finds the first one when it appears.
            log.debug("kafka updates (%s): %s", level, error)
        elif error.code() != codes._PARTITION_EOF:
            stats.errors += 1
            kafka_log.error(error)
        return None
    value = message.value()
    try:
        keys, embeddings = decode_update(value)
    except Exception as exc:  # any value the decoder refuses, whatever it raises
        stats.malformed += 1
        log.warning("kafka updates (%s): skipped a malformed message on %s partition %s at "
                    "offset %s (%s): %s", level, message.topic(), message.partition(),
                    message.offset(), hex_head(value), exc)  # fmt: skip
        return None
    return Update(message, message.topic(), embeddings.shape[1], keys, embeddings)


def merged(run: list[Update]) -> tuple[np.ndarray, np.ndarray]:
    """The keys and embeddings of ``run`` (updates of one table and dim), concatenated."""
    if len(run) == 1:
        return run[0].keys, run[0].embeddings
    return (
        np.concatenate([u.keys for u in run]),
        np.concatenate([u.embeddings for u in run]),
    )
