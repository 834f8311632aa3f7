"""Online embedding updates over Apache Kafka (DESIGN.md, Formats 4 and 6).

:class:`UpdateProducer` publishes updates: one topic per table tag ``hps_et.<model>.<table>``,
an empty message key, and a value of at most ``max_batch_size`` records
(:mod:`tierserve.ps.update_message`).

:class:`UpdateConsumer` applies them to one tier level (``volatile`` or ``persistent``) of a
:class:`~tierserve.ps.hierarchy.HierarchicalParameterServer`, in a background thread:

- it subscribes to ``^hps_et\\.((<filter>)|...)\\.<table>$`` built from that level's
  ``update_filters`` (regular expressions on model names);
- its consumer group is ``hps.<level>``, with ``.<replica>`` appended (the host name by
  default) when the level's tier lives in this process or on this machine (``hash_map``,
  ``parallel_hash_map``, ``rocks_db``): then every replica must see every update.  A shared
  tier (Redis) takes each update once per group;
- a malformed message, or one for a model or table this server does not hold, is counted,
  logged and skipped; a tier that cannot be reached is retried after ``failure_backoff_ms``
  (the message is not skipped, and its offset not committed);
- consecutive messages of one table are applied with one insert, of at most
  ``max_batch_size`` keys unless one message holds more (HugeCTR's dispatch chunks);
- offsets are committed after at most ``max_commit_interval`` messages, and only those of
  messages done: after a crash or a rebalance, updates are applied at least once, in order.

confluent-kafka is the client (extra ``kafka``).
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from .config import KafkaUpdateSourceConfig
from .errors import (
    BackendUnavailableError,
    InvalidInputError,
    NotFoundError,
    require_extra,
)
from .table_tag import TAG_PREFIX, table_tag
from .update_message import decode_update, encode_update

log = logging.getLogger(__name__)

_NAME_CHARS = "[A-Za-z0-9_-]"  # of a table name (table_tag.NAME_PATTERN)
#: Tier types whose data lives in this process or on this machine.
_LOCAL_TIERS = {"hash_map", "parallel_hash_map", "rocks_db"}


def _kafka():
    return require_extra("confluent_kafka", "kafka", "Kafka online updates")


def _bootstrap(brokers: str) -> str:
    """HugeCTR's ``host:port;host:port`` list as Kafka's comma-separated one."""
    return ",".join(b.strip() for b in brokers.replace(";", ",").split(",") if b.strip())


class UpdateProducer:
    """Publishes embedding updates to the topics the consumers read."""

    def __init__(self, brokers: str, max_batch_size: int = 1000, **options) -> None:
        if max_batch_size <= 0:
            raise InvalidInputError(f"max_batch_size must be positive, got {max_batch_size}")
        self.max_batch_size = int(max_batch_size)
        self._producer = _kafka().Producer({"bootstrap.servers": _bootstrap(brokers), **options})
        self._failed: list[str] = []

    def publish(self, model: str, table: str, keys, embeddings) -> int:
        """Queue the update of ``keys`` of ``model``'s ``table``; returns the messages queued."""
        topic = table_tag(model, table)
        keys = np.asarray(keys)
        embeddings = np.asarray(embeddings, dtype=np.float32)
        sent = 0
        for start in range(0, keys.shape[0], self.max_batch_size):
            end = start + self.max_batch_size
            value = encode_update(keys[start:end], embeddings[start:end])
            self._produce(topic, value)
            sent += 1
        return sent

    def _produce(self, topic: str, value: bytes) -> None:
        while True:
            try:
                self._producer.produce(topic, value=value, on_delivery=self._delivered)
                return
            except BufferError:  # the local queue is full: let deliveries drain it
                self._producer.poll(0.1)

    def _delivered(self, error, message) -> None:
        if error is not None:
            self._failed.append(f"{message.topic()}: {error}")

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued update is delivered; raise if any failed or timed out."""
        left = self._producer.flush(timeout)
        failed, self._failed = self._failed, []
        if left or failed:
            raise BackendUnavailableError(
                f"{left} update messages undelivered after {timeout} s; failures: {failed[:5]}"
            )

    def close(self, timeout: float = 30.0) -> None:
        self.flush(timeout)

    def __enter__(self) -> UpdateProducer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class ConsumerStats:
    """What an :class:`UpdateConsumer` did so far."""

    messages: int = 0  # applied
    keys: int = 0  # applied
    malformed: int = 0  # bad value: skipped
    rejected: int = 0  # unknown model or table, wrong dim: skipped
    retries: int = 0  # tier unreachable: retried after the backoff
    errors: int = 0  # Kafka errors reported by the client, unexpected failures (skipped)


class _Update(NamedTuple):
    """One decoded update message."""

    message: Any
    topic: str
    dim: int
    keys: np.ndarray
    embeddings: np.ndarray


def subscription(filters: list[str]) -> str:
    """The topic regex of a level whose ``update_filters`` are ``filters`` (plain groups and
    no counted repeats: librdkafka's regex engine knows neither ``(?:`` nor ``{m,n}``)."""
    models = "|".join(f"({f})" for f in filters)
    return rf"^{TAG_PREFIX}\.({models})\.{_NAME_CHARS}+$"


def group_id(level: str, tier_type: str, replica: str | None = None) -> str:
    """``hps.<level>``, plus ``.<replica>`` when the tier is not shared between replicas."""
    if tier_type in _LOCAL_TIERS:
        return f"hps.{level}.{replica or socket.gethostname()}"
    return f"hps.{level}"


class UpdateConsumer:
    """Applies the updates of Kafka to tier ``level`` of ``ps``; see the module docstring.

    ``start()`` runs it in a daemon thread, ``close()`` stops it and commits what was
    applied.  ``replica`` names this server in the consumer group of an unshared tier.
    """

    def __init__(
        self,
        ps,
        config: KafkaUpdateSourceConfig,
        level: str,
        replica: str | None = None,
        **options,
    ) -> None:
        if level not in ps.tiers:
            raise InvalidInputError(f"the parameter server has no {level} tier")
        self.ps = ps
        self.config = config
        self.level = level
        self.stats = ConsumerStats()
        self.group = group_id(level, ps.tiers[level].kind, replica)
        self.pattern = subscription(ps.update_filters(level))
        settings = {
            "bootstrap.servers": _bootstrap(config.brokers),
            "group.id": self.group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": config.metadata_refresh_interval_ms,
            **options,
        }
        self._consumer = _kafka().Consumer(settings)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._uncommitted = 0  # messages done since the last commit
        self._positions: dict[tuple[str, int], int] = {}  # next offset to commit

    def start(self) -> UpdateConsumer:
        self._consumer.subscribe([self.pattern])
        self._thread = threading.Thread(
            target=self._run, name=f"hps-updates-{self.level}", daemon=True
        )
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        try:
            self._commit(asynchronous=False)
        finally:
            self._consumer.close()

    def __enter__(self) -> UpdateConsumer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        timeout = self.config.poll_timeout_ms / 1000
        while not self._stop.is_set():
            try:
                messages = self._consumer.consume(self.config.receive_buffer_size, timeout)
            except Exception as exc:  # the client itself failed: back off and go on
                self.stats.errors += 1
                log.warning("kafka updates (%s): consume failed: %s", self.level, exc)
                self._stop.wait(self.config.failure_backoff_ms / 1000)
                continue
            run: list[_Update] = []  # consecutive updates of one topic and dim: one insert
            run_keys = 0
            for message in messages:
                if self._stop.is_set():
                    return  # not applied, not committed: read again on the next start
                update = self._decode(message)
                if run and (
                    update is None  # an error or a malformed value (counted): done alone
                    or (update.topic, update.dim) != (run[0].topic, run[0].dim)
                    or run_keys + update.keys.size > self.config.max_batch_size
                ):
                    self._apply(run)
                    run, run_keys = [], 0
                if update is None:
                    self._applied(message)
                    continue
                run.append(update)
                run_keys += update.keys.size
            self._apply(run)
            self._commit(asynchronous=True)

    def _decode(self, message) -> _Update | None:
        """The update a message carries, or None (counted) for an error or a malformed value."""
        error = message.error()
        if error is not None:
            if error.code() != _kafka().KafkaError._PARTITION_EOF:
                self.stats.errors += 1
                log.warning("kafka updates (%s): %s", self.level, error)
            return None
        try:
            keys, embeddings = decode_update(message.value())
        except InvalidInputError as exc:  # MalformedMessageError included
            self.stats.malformed += 1
            log.warning("kafka updates (%s): skipped a malformed message on %s at offset %s: %s",
                        self.level, message.topic(), message.offset(), exc)  # fmt: skip
            return None
        return _Update(message, message.topic(), embeddings.shape[1], keys, embeddings)

    def _apply(self, run: list[_Update]) -> None:
        """Apply the updates of ``run`` (one topic, one dim) with one insert; when the
        insert refuses them, one by one, so that only the bad ones are skipped."""
        if not run:
            return
        keys = run[0].keys if len(run) == 1 else np.concatenate([u.keys for u in run])
        embeddings = (
            run[0].embeddings if len(run) == 1 else np.concatenate([u.embeddings for u in run])
        )
        while not self._stop.is_set():
            try:
                self.ps.apply_update(run[0].topic, keys, embeddings, level=self.level)
            except (InvalidInputError, NotFoundError) as exc:
                if len(run) > 1:
                    for one in run:
                        self._apply([one])
                    return
                self._skip(run[0].message, "rejected", exc)
                return
            except BackendUnavailableError as exc:
                self.stats.retries += 1
                log.warning("kafka updates (%s): %s; retrying in %s ms", self.level, exc,
                            self.config.failure_backoff_ms)  # fmt: skip
                self._stop.wait(self.config.failure_backoff_ms / 1000)
                continue
            except Exception as exc:  # a bug must not stop the updates behind these
                for one in run:
                    self._skip(one.message, "errors", exc)
                return
            self.stats.messages += len(run)
            self.stats.keys += int(keys.size)
            for one in run:
                self._applied(one.message)
            return

    def _skip(self, message, counter: str, exc: BaseException) -> None:
        setattr(self.stats, counter, getattr(self.stats, counter) + 1)
        log.warning("kafka updates (%s): skipped the message on %s at offset %s: %s",
                    self.level, message.topic(), message.offset(), exc,
                    exc_info=exc if counter == "errors" else None)  # fmt: skip
        self._applied(message)

    def _applied(self, message) -> None:
        """Mark ``message`` done (applied or skipped): its offset may be committed."""
        if message.error() is not None:
            return
        self._positions[(message.topic(), message.partition())] = message.offset() + 1
        self._uncommitted += 1
        if self._uncommitted >= self.config.max_commit_interval:
            self._commit(asynchronous=True)

    def _commit(self, asynchronous: bool) -> None:
        """Commit the offsets after the messages done, and only those (a message consumed
        but not yet applied is read again after a crash)."""
        if not self._positions:
            return
        kafka = _kafka()
        offsets = [kafka.TopicPartition(t, p, o) for (t, p), o in self._positions.items()]
        self._positions.clear()
        self._uncommitted = 0
        try:
            self._consumer.commit(offsets=offsets, asynchronous=asynchronous)
        except Exception as exc:
            # E.g. a rebalance took the partitions away.  Their new reader starts from the
            # last committed offset and applies the same updates again, in order: updates
            # only set vectors, so that ends in the same state.
            log.warning("kafka updates (%s): commit failed: %s", self.level, exc)


def start_update_consumers(ps, source, replica: str | None = None) -> list[UpdateConsumer]:
    """One running :class:`UpdateConsumer` per tier level of ``ps`` that takes updates, when
    ``source`` (``ps.json``'s ``update_source``) is a Kafka one; none otherwise."""
    if not isinstance(source, KafkaUpdateSourceConfig):
        return []
    consumers = []
    try:
        for level, tier in ps.tiers.items():
            if not getattr(tier, "read_only", False) and ps.update_filters(level):
                consumers.append(UpdateConsumer(ps, source, level, replica).start())
    except BaseException:
        for consumer in consumers:
            consumer.close()
        raise
    for consumer in consumers:
        log.info("kafka updates: %s tier reads %s as group %s", consumer.level,
                 consumer.pattern, consumer.group)  # fmt: skip
    return consumers
