"""Online embedding updates over Apache Kafka (DESIGN.md, Formats 4 and 6).

:class:`UpdateProducer` publishes updates: one topic per table tag ``hps_et.<model>.<table>``,
an empty message key, and a value of at most ``max_batch_size`` records
(:mod:`tierserve.ps.update_message`).

:class:`UpdateConsumer` applies them to one tier level (``volatile`` or ``persistent``) of a
:class:`~tierserve.ps.hierarchy.HierarchicalParameterServer`, in a background thread:

- it subscribes to ``^hps_et\\.((<filter>)|...)\\.<table>$`` built from that level's
  ``update_filters`` (regular expressions on model names);
- its consumer group is ``hps.<level>``, with ``.<replica>`` appended when the level's tier
  is not shared between replicas (:attr:`Tier.shared <tierserve.ps.tier.Tier.shared>`
  false: ``hash_map``, ``parallel_hash_map``, ``rocks_db``): then every replica applies
  every update.  A shared tier (Redis) takes each update once per group;
- the replica id is ``$TIERSERVE_REPLICA_ID`` when set (``tierserve serve --replica-id``
  sets it), else unique per process (host name,
  process id and a random part, :func:`replica_id`), so two servers on one host never split
  the updates of their in-process tiers between them.  A process with a new id reads the
  topics from the start (``auto.offset.reset: earliest``); a stable id resumes where the
  last process with that id stopped, and in a group of its own (an unshared tier, cache
  invalidation) it is a static member (``group.instance.id``), so a process restarted after
  a SIGKILL gets its partitions back at once rather than after the dead one's session;
- at its start an applying consumer reads the end offsets of its topics and reports itself
  caught up (:meth:`UpdateConsumer.status`, hence the server's readiness) only once it read
  them up to there (:mod:`tierserve.ps.kafka_catchup`);
- a topic deleted and created again (a new topic id, :mod:`tierserve.ps.kafka_topics`) is
  read from its start by a new Kafka client;
- a malformed message (any value the decoder refuses), or one for a model or table this
  server does not hold, is counted, logged (its first bytes in hex) and skipped, and its
  offset committed; a tier that cannot be reached is retried after ``failure_backoff_ms``
  (the message is not skipped, and its offset not committed);
- should the loop fail anyway (a bug), it restarts after a growing backoff (base
  ``failure_backoff_ms``, at most :data:`MAX_RESTART_BACKOFF_S`) with a new Kafka client,
  which reads again from the last committed offset; a message that the loop failed on
  :data:`MAX_FAILURES_PER_MESSAGE` times in a row is skipped.  :meth:`UpdateConsumer.status`
  tells whether the loop runs, how often it restarted and its last error;
- it takes what arrives within ``poll_timeout_ms``, or less as soon as that holds
  ``receive_buffer_size`` embedding rows (HugeCTR counts rows, not messages);
- consecutive messages of one table are applied with one insert, of at most
  ``max_batch_size`` keys unless one message holds more (HugeCTR's dispatch chunks);
- offsets are committed after at most ``max_commit_interval`` messages, and only those of
  messages done: after a crash or a rebalance, updates are applied at least once, in order.

With a shared tier, only the replica that applies an update hears of it through
:meth:`~tierserve.ps.hierarchy.HierarchicalParameterServer.insert`; so every replica also
runs an :class:`InvalidationConsumer` (group ``hps.<level>.<replica>.cache``) that reads the
same topics, writes no tier, waits until the applying group ``hps.<level>`` has committed
past each message (so the shared tier holds the update), and then tells this process's
update listeners (its embedding caches) to drop the updated keys.

confluent-kafka is the client (extra ``kafka``).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from tierserve.core.errors import (
    BackendUnavailableError,
    ConfigError,
    InvalidInputError,
    NotFoundError,
    require_extra,
)

from . import update_replay
from .config import KafkaUpdateSourceConfig
from .kafka_catchup import CatchUp
from .kafka_log import KafkaLog
from .kafka_topics import TopicAdmin
from .retry import ExponentialBackoff
from .stats import LatencyHistogram
from .table_tag import TAG_PREFIX, parse_table_tag, table_tag
from .update_message import decode_update, encode_update

log = logging.getLogger(__name__)

_NAME_CHARS = "[A-Za-z0-9_-]"  # of a table name (table_tag.NAME_PATTERN)
#: The environment variable that names this replica in consumer groups (see replica_id).
REPLICA_ENV = "TIERSERVE_REPLICA_ID"
_REPLICA_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,200}")
#: The longest wait between restarts of a failing consumer loop.
MAX_RESTART_BACKOFF_S = 10.0
#: Failures of the loop on one message after which that message is skipped.
MAX_FAILURES_PER_MESSAGE = 3
#: How long after a message was published an invalidation consumer waits for the applying
#: group to commit past it (then it drops the keys anyway).
APPLIED_WAIT_S = 60.0
#: Bytes of a skipped message's value shown (in hex) in the log.
_LOG_BYTES = 32
_process_replica: str | None = None
_MAX_CONSUME = 100_000  # messages per consume() call (librdkafka takes at most 1,000,000)
#: Bounds (seconds) of the update freshness histogram: message timestamp to applied.
FRESHNESS_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
)  # fmt: skip
#: The longest a fetch waits for data (``fetch.wait.max.ms``): every other request to that
#: broker waits behind it, and a new topic's first update waits for several in a row.
FETCH_WAIT_MAX_MS = 50
_HOUSEKEEPING_S = 1.0  # how often lag is measured and a broker outage probed
_APPLY, _WAIT, _STALE = "apply", "wait", "stale"  # what the consumer does with a message


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
        self.kafka_log = KafkaLog("kafka updates (producer)")
        self._producer = _kafka().Producer(
            {"bootstrap.servers": _bootstrap(brokers), **self.kafka_log.client_config(), **options}
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


@dataclass
class ConsumerStats:
    """What an :class:`UpdateConsumer` did so far."""

    messages: int = 0  # applied
    keys: int = 0  # applied
    malformed: int = 0  # bad value: skipped
    rejected: int = 0  # unknown table, wrong dim: skipped
    stale: int = 0  # older than the served version's files (update_replay): skipped
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


def replica_id() -> str:
    """This process's name in the consumer groups of unshared tiers and of cache invalidation.

    ``$TIERSERVE_REPLICA_ID`` when set (letters, digits, ``.``, ``_``, ``-``); else
    ``<host>-<pid>-<random>``, made once per process, so that two servers on one host are
    two replicas.
    """
    global _process_replica
    configured = os.environ.get(REPLICA_ENV)
    if configured is not None:
        return check_replica_id(configured, REPLICA_ENV)
    if _process_replica is None:
        host = re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "host"
        _process_replica = f"{host}-{os.getpid()}-{secrets.token_hex(3)}"
    return _process_replica


def check_replica_id(value: str, source: str) -> str:
    """``value`` if it can name a replica; else a :class:`ConfigError` naming ``source``."""
    if not _REPLICA_PATTERN.fullmatch(value):
        raise ConfigError(
            f"{source}={value!r}: a replica id is 1 to 200 letters, digits, '.', '_' or '-'"
        )
    return value


def group_id(level: str, shared: bool | str, replica: str | None = None) -> str:
    """``hps.<level>``, plus ``.<replica>`` (default :func:`replica_id`) when the level's tier
    is not ``shared`` between replicas, or ``.<host>`` when it is shared by the processes of
    one host only (``shared == "host"``: multi_process_hash_map)."""
    if shared == "host":
        return f"hps.{level}.{re.sub(r'[^A-Za-z0-9._-]', '_', socket.gethostname()) or 'host'}"
    if shared:
        return f"hps.{level}"
    return f"hps.{level}.{replica or replica_id()}"


def metadata_settings(config: KafkaUpdateSourceConfig) -> dict:
    """librdkafka's metadata settings from ``metadata_refresh_interval_ms``: a topic created
    after a consumer subscribed (a model's first update) is found within that interval."""
    refresh = int(config.metadata_refresh_interval_ms)
    return {
        "topic.metadata.refresh.interval.ms": refresh,
        # Cached metadata must outlive a refresh or two; librdkafka's default is 15 minutes.
        "metadata.max.age.ms": max(3 * refresh, 5000),
    }


def _hex_head(value) -> str:
    """The first bytes of a message value in hex, for logs (binary is never logged raw)."""
    if value is None:
        return "no value"
    head = bytes(value[:_LOG_BYTES]).hex()
    return f"{len(value)} bytes: {head}{'...' if len(value) > _LOG_BYTES else ''}"


def _rows(message) -> int:
    """The embedding rows a message's header and length announce (1 for an error or a value
    too short to say): what the receive buffer counts."""
    value = message.value() if message.error() is None else None
    if not value or len(value) < 8:
        return 1
    value_size = int.from_bytes(value[4:8], "little")
    return max(1, (len(value) - 8) // (8 + value_size))


def _message_id(message) -> tuple[str, int, int]:
    return (message.topic(), message.partition(), message.offset())


@dataclass(frozen=True)
class ConsumerStatus:
    """Whether an :class:`UpdateConsumer` reads updates, for health checks and metrics."""

    level: str
    role: str  # "apply" (writes the tier) or "invalidate" (tells this process's caches)
    group: str
    alive: bool  # its loop runs (false while it waits to restart, and once it stopped)
    restarts: int  # times its loop failed and was restarted
    last_error: str | None  # the last failure of its loop, if any
    #: ``(topic, partition, messages behind the partition's end)`` per assigned partition
    lag: tuple[tuple[str, int, int], ...] = ()
    #: message timestamp to applied and visible, in seconds (``LatencyHistogram.cumulative``
    #: as ``{"count", "sum", "buckets"}``); None for a consumer that applies nothing
    freshness: dict | None = None
    #: partitions whose model is not loaded yet: paused, read once it is
    waiting: int = 0
    kafka_down: bool = False  # no broker answers (an outage: see tierserve.ps.kafka_log)
    #: it read what its topics held when it started (tierserve.ps.kafka_catchup): the server
    #: is not ready until then; ``not_ready`` says why not
    caught_up: bool = True
    not_ready: str | None = None


class UpdateConsumer:
    """Applies the updates of Kafka to tier ``level`` of ``ps``; see the module docstring.

    ``start()`` runs it in a daemon thread, ``close()`` stops it and commits what was
    applied.  ``replica`` names this server in the consumer group of an unshared tier
    (default :func:`replica_id`); ``backoff`` spaces the restarts of a failing loop.
    """

    role = "apply"

    def __init__(
        self,
        ps,
        config: KafkaUpdateSourceConfig,
        level: str,
        replica: str | None = None,
        *,
        backoff: ExponentialBackoff | None = None,
        **options,
    ) -> None:
        if level not in ps.tiers:
            raise InvalidInputError(f"the parameter server has no {level} tier")
        self.ps = ps
        self.config = config
        self.level = level
        self.stats = ConsumerStats()
        #: a replica id given (or $TIERSERVE_REPLICA_ID) names the same server after a restart
        self._stable_replica = replica is not None or REPLICA_ENV in os.environ
        self.replica = replica or replica_id()
        self.group = self._group(ps.tiers[level])
        self.pattern = subscription(ps.update_filters(level))
        self.backoff = backoff or ExponentialBackoff(
            max(config.failure_backoff_ms / 1000, 0.05), MAX_RESTART_BACKOFF_S
        )
        self.kafka_log = KafkaLog(f"kafka updates ({level}, {self.role})")
        self._settings = {
            "bootstrap.servers": _bootstrap(config.brokers),
            "group.id": self.group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **metadata_settings(config),
            # A fetch waits at most this long for data: requests behind it on the connection
            # (metadata, the offset lookups of a new partition or a replay) wait no longer
            # (librdkafka's default: 500 ms); an idle consumer fetches 20 times a second.
            "fetch.wait.max.ms": min(FETCH_WAIT_MAX_MS, config.poll_timeout_ms),
            **self._membership(ps.tiers[level]),
            **self.kafka_log.client_config(),
            **options,
        }
        self._consumer = _kafka().Consumer(self._settings)
        self.freshness = LatencyHistogram(FRESHNESS_BUCKETS)
        self.lag: tuple[tuple[str, int, int], ...] = ()
        self._assigned: set[tuple[str, int]] = set()
        self._held: dict[tuple[str, int], int] = {}  # paused until the model loads: offset
        self._reread: set[tuple[str, int]] = set()  # seeked back during this batch
        self._synced_to: dict[tuple[str, int], Any] = {}  # the version each is up to date for
        self._housekept = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._uncommitted = 0  # messages done since the last commit
        self._positions: dict[tuple[str, int], int] = {}  # next offset to commit
        self.restarts = 0
        self.last_error: str | None = None
        self._restarting = False
        self._handling: tuple[str, int, int] | None = None  # the message the loop is on
        self._failures: tuple[tuple[str, int, int] | None, int] = (None, 0)  # in a row
        self._progress = 0  # batches of messages done
        self._poison: set[tuple[str, int, int]] = set()  # messages the loop failed on
        self.catchup = CatchUp(self.kafka_log.name, needed=self.role == "apply")
        self._topics: TopicAdmin | None = None  # made on first use
        self._topics_checked = 0.0
        self._recreated: set[str] = set()  # topics to read from their start once assigned

    def _group(self, tier) -> str:
        return group_id(self.level, tier.shared, self.replica)

    def _membership(self, tier) -> dict:
        """Static group membership (``group.instance.id``: the replica id) when the group is
        this replica's alone and its id outlives the process: a server restarted after a
        SIGKILL takes its partitions back at once, instead of waiting for the dead member's
        session to time out (45 s).  Not for a group shared by replicas: a member that
        stops cleanly would hold its partitions from the others for that long."""
        if not self._stable_replica or tier.shared:
            return {}
        return {"group.instance.id": self.replica}

    def _topic_admin(self) -> TopicAdmin:
        if self._topics is None:
            self._topics = TopicAdmin(self._settings)
        return self._topics

    def start(self) -> UpdateConsumer:
        self._subscribe()
        self._thread = threading.Thread(
            target=self._supervise, name=f"hps-{self.role}-{self.level}", daemon=True
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
            self._topics = None  # its client goes with it (AdminClient has no close)
            self._consumer.close()

    def status(self) -> ConsumerStatus:
        """Whether the loop runs, how often it was restarted, and its last failure."""
        alive = (
            self._thread is not None
            and self._thread.is_alive()
            and not self._restarting
            and not self._stop.is_set()
        )
        caught_up, not_ready = self.catchup.status(self._catch_up_state)
        return ConsumerStatus(
            self.level, self.role, self.group, alive, self.restarts, self.last_error,
            lag=self.lag, waiting=len(self._held), kafka_down=self.kafka_log.down,
            caught_up=caught_up, not_ready=not_ready,
            freshness=None if self.role != "apply" else {
                "count": self.freshness.count, "sum": self.freshness.total,
                "buckets": self.freshness.cumulative(),
            },
        )  # fmt: skip

    def __enter__(self) -> UpdateConsumer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the loop ----------------------------------------------------------------------------

    def _supervise(self) -> None:
        """Run the loop; when it fails, restart it (with a new client) after a backoff."""
        failures = 0  # in a row, without a batch done in between
        progress = self._progress
        while not self._stop.is_set():
            try:
                self._run()
                return
            except Exception as exc:  # a bug: the updates behind it must still be applied
                failures = 1 if self._progress != progress else failures + 1
                progress = self._progress
                self.restarts += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:500]
                self._restarting = True
                self._note_failure()
                delay = self.backoff.compute(failures)
                log.error("kafka updates (%s): the consumer loop failed; restarting in %.2f s",
                          self.level, delay, exc_info=exc)  # fmt: skip
                if self._stop.wait(delay):
                    return
                try:
                    self._reopen()
                except Exception as reopen_exc:  # the broker may be away: try again later
                    self.last_error = f"{type(reopen_exc).__name__}: {reopen_exc}"[:500]
                    log.warning("kafka updates (%s): reopening the consumer failed: %s",
                                self.level, reopen_exc)  # fmt: skip
                    continue
                self._restarting = False

    def _note_failure(self) -> None:
        """Count a failure on the message being handled; skip it once it failed too often."""
        current = self._handling
        last, count = self._failures
        count = count + 1 if current is not None and current == last else 1
        self._failures = (current, count)
        if current is not None and count >= MAX_FAILURES_PER_MESSAGE:
            self._poison.add(current)
            log.error("kafka updates (%s): the loop failed %d times on the message on %s "
                      "partition %s at offset %s; it will be skipped",
                      self.level, count, *current)  # fmt: skip

    def _reopen(self) -> None:
        """A new Kafka client in the same group: it reads again from the committed offsets,
        so the messages consumed but not done when the loop failed are not lost."""
        try:
            self._commit(asynchronous=False)
        finally:
            self._positions.clear()
            self._uncommitted = 0
            old, self._consumer = self._consumer, None
            try:
                old.close()
            except Exception as exc:
                log.warning("kafka updates (%s): closing the failed consumer: %s", self.level, exc)
        self._consumer = _kafka().Consumer(self._settings)
        self._subscribe()

    def _subscribe(self) -> None:
        self._assigned.clear()
        self._held.clear()
        self._synced_to.clear()
        self.catchup.handled.clear()
        self._consumer.subscribe(
            [self.pattern], on_assign=self._on_assign, on_revoke=self._on_revoke
        )

    def _on_assign(self, consumer, partitions) -> None:
        recreated = [tp for tp in partitions if tp.topic in self._recreated]
        if recreated:  # its committed offsets are the old topic's: read it from its start
            for tp in recreated:
                tp.offset = _kafka().OFFSET_BEGINNING
            consumer.assign(partitions)
            self._recreated -= {tp.topic for tp in recreated}
        self._assigned.update((tp.topic, tp.partition) for tp in partitions)
        self.kafka_log.recovered()

    def _on_revoke(self, consumer, partitions) -> None:
        # What is done is committed now, so that the next reader does not apply it again.
        self._commit(asynchronous=False)
        for tp in partitions:
            key = (tp.topic, tp.partition)
            self._assigned.discard(key)
            self._held.pop(key, None)
            self._synced_to.pop(key, None)
            self.catchup.handled.pop(key, None)

    def _run(self) -> None:
        timeout = self.config.poll_timeout_ms / 1000
        while not self._stop.is_set():
            try:
                self._housekeeping()
                messages = self._receive(timeout)
            except Exception as exc:  # the client itself failed: back off and go on
                self.stats.errors += 1
                log.warning("kafka updates (%s): consume failed: %s", self.level, exc)
                self._stop.wait(self.config.failure_backoff_ms / 1000)
                continue
            if self.kafka_log.down and any(m.error() is None for m in messages):
                self.kafka_log.recovered()
            self._reread.clear()
            run: list[_Update] = []  # consecutive updates of one topic and dim: one insert
            run_keys = 0
            for message in messages:
                if self._stop.is_set():
                    return  # not applied, not committed: read again on the next start
                verdict = self._admit(message)
                if verdict == _WAIT:
                    continue  # read again once its model loads (not done, not committed)
                if verdict == _STALE:
                    self._apply(run)  # the messages before it first: offsets stay in order
                    run, run_keys = [], 0
                    self.stats.stale += 1
                    self._applied(message)
                    continue
                update = self._take(message)
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
            self._handling = None
            if messages:
                self._progress += 1
            self._commit(asynchronous=True)
            self.catchup.check(self._catch_up_state)

    # --- versions, waiting models, lag ------------------------------------------------------

    def _admit(self, message) -> str:
        """Whether to apply ``message`` now, leave it for when its model loads (its partition
        paused), or skip it as older than the served version (:mod:`.update_replay`)."""
        if message.error() is not None:
            return _APPLY
        key = (message.topic(), message.partition())
        if key in self._held or key in self._reread:
            return _WAIT
        try:
            model, _ = parse_table_tag(key[0])
        except InvalidInputError:
            return _APPLY  # refused (and counted) by the insert
        served = self._committed(model)
        if served is None:
            self._hold(key, message.offset())
            return _WAIT
        if self._synced_to.get(key) is not served:
            try:
                seeked = self._sync(key, served, message.offset())
            except _kafka().KafkaException as exc:  # the broker did not answer: later
                log.warning("kafka updates (%s): finding where %s partition %s starts for "
                            "model %s generation %d failed (%s); trying again", self.level,
                            *key, served.name, served.generation, exc)  # fmt: skip
                self._consumer.seek(_kafka().TopicPartition(*key, message.offset()))
                seeked = True
            if seeked:
                self._reread.add(key)  # the rest of this batch comes again
                return _WAIT
        kind, ms = message.timestamp()
        if kind != _kafka().TIMESTAMP_NOT_AVAILABLE and ms < update_replay.version_time_ms(served):
            return _STALE
        return _APPLY

    def _committed(self, model: str):
        try:
            return self.ps.model(model)
        except NotFoundError:
            return None

    def _hold(self, key: tuple[str, int], offset: int) -> None:
        """Pause ``key`` and rewind it to ``offset``: its model is not loaded yet."""
        tp = _kafka().TopicPartition(*key, offset)
        self._consumer.pause([tp])
        self._consumer.seek(tp)
        if key not in self._held:
            log.info("kafka updates (%s): %s partition %s waits until its model is loaded",
                     self.level, *key)  # fmt: skip
        self._held[key] = offset

    def _sync(self, key: tuple[str, int], served, at: int | None = None) -> bool:
        """Bring ``key`` up to date for version ``served``: rewind it to the first message
        published since the version's files were written.  ``at``: the offset it reads next,
        when known.  True when it seeked."""
        when = update_replay.version_time_ms(served)
        if not when or update_replay.synced(served, self.level, key):
            self._synced_to[key] = served
            if at is not None:
                self.catchup.handled[key] = at
            return False
        kafka = _kafka()
        # The end first: a message written between the two lookups is past it, not skipped.
        low, high = self._consumer.get_watermark_offsets(kafka.TopicPartition(*key), timeout=5)
        found = self._consumer.offsets_for_times([kafka.TopicPartition(*key, when)], timeout=5)
        offset = found[0].offset if found and found[0].offset >= 0 else high
        if at is None and offset <= low and self._reads_from_start(key):
            at = low
        seek = offset != at
        if seek:
            self._consumer.seek(kafka.TopicPartition(*key, offset))
        self.catchup.handled[key] = offset  # the messages before it are older than the files
        self._synced_to[key] = served
        update_replay.mark_synced(served, self.level, key)
        log.info("kafka updates (%s): %s partition %s reads from offset %s, the first update "
                 "since model %s generation %d was written", self.level, *key, offset,
                 served.name, served.generation)  # fmt: skip
        return seek

    def _reads_from_start(self, key: tuple[str, int]) -> bool:
        """Whether ``key`` will be read from its first offset anyway: nothing read from it
        yet and no committed offset (``auto.offset.reset: earliest``).  Seeking such a
        partition to its start is not needed, and a seek while librdkafka still looks that
        start up makes it look again after a fixed 500 ms: a new topic's first update
        waited for it."""
        tp = _kafka().TopicPartition(*key)
        if self._consumer.position([tp])[0].offset >= 0:
            return False
        return self._consumer.committed([tp], timeout=5)[0].offset < 0

    def _housekeeping(self) -> None:
        """Between batches: resume the partitions whose model loaded, rewind those whose
        model has a new version, measure the lag, and probe the broker during an outage."""
        kafka = _kafka()
        for key, offset in list(self._held.items()):
            served = self._committed(parse_table_tag(key[0])[0])
            if served is None:
                continue
            if not self._sync(key, served, offset):
                self._consumer.seek(kafka.TopicPartition(*key, offset))
            self._consumer.resume([kafka.TopicPartition(*key)])
            del self._held[key]
        for key in list(self._assigned):
            if key in self._held:
                continue
            try:
                model, _ = parse_table_tag(key[0])
            except InvalidInputError:
                continue
            served = self._committed(model)
            if served is not None and self._synced_to.get(key) is not served:
                try:
                    self._sync(key, served)
                except kafka.KafkaException as exc:  # not fetching yet: try next time
                    log.debug("kafka updates (%s): rewinding %s: %s", self.level, key, exc)
        now = time.monotonic()
        if now - self._housekept < _HOUSEKEEPING_S:
            return
        self._housekept = now
        if self.kafka_log.down:
            try:
                self._consumer.list_topics(timeout=1.0)
                self.kafka_log.recovered()
            except kafka.KafkaException:
                pass
        self.lag = self._lag()
        self._follow_recreated()
        self._catch_up()

    # --- a restart's catching up, recreated topics ----------------------------------------

    def _catch_up_state(self, key: tuple[str, int]) -> str | None:
        """How partition ``key`` counts towards catching up (see CatchUp._short)."""
        try:
            model, _ = parse_table_tag(key[0])
        except InvalidInputError:
            return None
        served = self._committed(model)
        if served is None:
            return None
        replayed = bool(update_replay.version_time_ms(served))
        if key in self._assigned:
            if not replayed:  # its tables were loaded by another process: no replay
                return "group"
            if self._synced_to.get(key) is not served or key in self._held or key in self._reread:
                return "waiting"
            return "local"
        shared = bool(self.ps.tiers[self.level].shared)
        return "group" if shared or not replayed else "waiting"

    def _catch_up(self) -> None:
        """Read the end offsets seen at start (once), and the group's committed offsets."""
        catchup = self.catchup
        if catchup.targets is None:
            if self.kafka_log.down:  # asked again once a broker answers
                catchup.unknown(self.kafka_log.last_error or "no broker answers")
                return
            try:  # a short wait: the loop's poll serves the client's error callbacks
                catchup.set_targets(self._topic_admin().end_offsets(self.pattern, timeout=1))
            except Exception as exc:  # no broker answers: not ready, asked again next time
                catchup.unknown(exc)
                return
        catchup.check(self._catch_up_state, self._group_committed)

    def _group_committed(self, keys) -> dict[tuple[str, int], int]:
        kafka = _kafka()
        try:
            parts = self._consumer.committed([kafka.TopicPartition(*k) for k in keys], timeout=2)
        except kafka.KafkaException as exc:
            log.debug("kafka updates (%s): reading committed offsets: %s", self.level, exc)
            return {}
        return {(tp.topic, tp.partition): tp.offset for tp in parts}

    def _follow_recreated(self) -> None:
        """Every ``metadata_refresh_interval_ms`` (at least a second): when an assigned topic
        was deleted and created again, start a new client that reads it from its start (see
        :mod:`tierserve.ps.kafka_topics`)."""
        now = time.monotonic()
        interval = max(_HOUSEKEEPING_S, self.config.metadata_refresh_interval_ms / 1000)
        if self.kafka_log.down or now - self._topics_checked < interval or not self._assigned:
            return
        self._topics_checked = now
        try:
            changed = self._topic_admin().recreated({t for t, _ in self._assigned}, timeout=1)
        except Exception as exc:  # the broker may be away: next time
            log.debug("kafka updates (%s): describing topics: %s", self.level, exc)
            return
        if not changed:
            return
        for topic, (old, new) in sorted(changed.items()):
            log.warning("kafka updates (%s): topic %s was deleted and created again (id %s, "
                        "was %s); reading it from its start with a new Kafka client",
                        self.level, topic, new, old)  # fmt: skip
        self._recreated |= set(changed)
        self.catchup.drop_topics(changed)
        # Offsets of the old topics must not be committed for the new ones.
        self._positions = {k: v for k, v in self._positions.items() if k[0] not in changed}
        self._reopen()

    def _lag(self) -> tuple[tuple[str, int, int], ...]:
        kafka = _kafka()
        out = []
        parts = [kafka.TopicPartition(*key) for key in sorted(self._assigned)]
        if not parts:
            return ()
        for tp in self._consumer.position(parts):
            try:
                _, high = self._consumer.get_watermark_offsets(tp, cached=True)
            except kafka.KafkaException:
                continue
            if high < 0:
                continue
            position = tp.offset if tp.offset >= 0 else self._held.get((tp.topic, tp.partition))
            if position is None:
                continue
            out.append((tp.topic, tp.partition, max(high - position, 0)))
        return tuple(out)

    def _receive(self, timeout: float) -> list:
        """The messages that arrive within ``timeout`` seconds, or fewer: as soon as they hold
        ``receive_buffer_size`` embedding rows (HugeCTR's ``max_receive_buffer_size`` counts
        rows, not messages), they are handed on without waiting out the timeout."""
        limit = self.config.receive_buffer_size
        deadline = time.monotonic() + timeout
        messages: list = []
        rows = 0
        while rows < limit:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            first = self._consumer.poll(left)  # waits for one message at most
            if first is None:
                break
            # Then what the client already holds, without waiting (each message holds at
            # least one row, so at most limit - rows more are needed).
            wanted = min(max(limit - rows - 1, 1), _MAX_CONSUME)
            batch = [first, *self._consumer.consume(wanted, 0)]
            messages.extend(batch)
            rows += sum(_rows(m) for m in batch)
        return messages

    def _take(self, message) -> _Update | None:
        """:meth:`_decode`, unless the loop already failed on ``message`` too often."""
        if message.error() is None:
            self._handling = _message_id(message)
            if self._handling in self._poison:
                self._poison.discard(self._handling)
                self.stats.errors += 1
                log.warning("kafka updates (%s): skipped the message on %s partition %s at "
                            "offset %s (%s): the loop failed on it", self.level,
                            *self._handling, _hex_head(message.value()))  # fmt: skip
                return None
        return self._decode(message)

    def _decode(self, message) -> _Update | None:
        """The update a message carries, or None (counted) for an error or a malformed value."""
        error = message.error()
        if error is not None:
            codes = _kafka().KafkaError
            if error.code() == codes.UNKNOWN_TOPIC_OR_PART:
                # No topic matches the subscription yet (no update was ever published): the
                # metadata refresh finds the first one when it appears.
                log.debug("kafka updates (%s): %s", self.level, error)
            elif error.code() != codes._PARTITION_EOF:
                self.stats.errors += 1
                self.kafka_log.error(error)
            return None
        value = message.value()
        try:
            keys, embeddings = decode_update(value)
        except Exception as exc:  # any value the decoder refuses, whatever it raises
            self.stats.malformed += 1
            log.warning("kafka updates (%s): skipped a malformed message on %s partition %s at "
                        "offset %s (%s): %s", self.level, message.topic(), message.partition(),
                        message.offset(), _hex_head(value), exc)  # fmt: skip
            return None
        return _Update(message, message.topic(), embeddings.shape[1], keys, embeddings)

    @staticmethod
    def _merged(run: list[_Update]) -> tuple[np.ndarray, np.ndarray]:
        if len(run) == 1:
            return run[0].keys, run[0].embeddings
        return (
            np.concatenate([u.keys for u in run]),
            np.concatenate([u.embeddings for u in run]),
        )

    def _apply(self, run: list[_Update]) -> None:
        """Apply the updates of ``run`` (one topic, one dim) with one insert; when the
        insert refuses them, one by one, so that only the bad ones are skipped."""
        if not run:
            return
        keys, embeddings = self._merged(run)
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
            self._done(run, keys)
            return

    def _done(self, run: list[_Update], keys: np.ndarray) -> None:
        self.stats.messages += len(run)
        self.stats.keys += int(keys.size)
        now = time.time()
        for one in run:
            kind, ms = one.message.timestamp()
            if kind:  # the insert returned: the rows are in the tier and its caches
                self.freshness.observe(max(now - ms / 1000, 0.0))
            self._applied(one.message)

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
        key = (message.topic(), message.partition())
        self._positions[key] = self.catchup.handled[key] = message.offset() + 1
        self._uncommitted += 1
        if self._uncommitted >= self.config.max_commit_interval:
            self._commit(asynchronous=True)

    def _commit(self, asynchronous: bool) -> None:
        """Commit the offsets after the messages done, and only those (a message consumed
        but not yet applied is read again after a crash)."""
        if not self._positions or self._consumer is None:
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


class InvalidationConsumer(UpdateConsumer):
    """Tells this process's update listeners of the updates another replica applies to a
    shared tier (see the module docstring); writes no tier.

    Its group is ``hps.<level>.<replica>.cache``.  For each run of messages it waits until
    the applying group ``hps.<level>`` has committed past them (at most until
    :data:`APPLIED_WAIT_S` after they were published), then calls
    :meth:`~tierserve.ps.hierarchy.HierarchicalParameterServer.notify_update` with no
    vectors: the listeners drop the keys, and their next lookup reads the updated tier.
    """

    role = "invalidate"

    def _admit(self, message) -> str:
        return _APPLY  # it writes no tier: the applying consumer decides

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now - self._housekept >= _HOUSEKEEPING_S:
            self._housekept = now
            self.lag = self._lag()
            self._follow_recreated()

    def _membership(self, tier) -> dict:
        # Its group is this replica's alone, whatever the tier.
        return {"group.instance.id": self.replica} if self._stable_replica else {}

    def __init__(self, ps, config: KafkaUpdateSourceConfig, level: str,
                 replica: str | None = None, **kwargs) -> None:  # fmt: skip
        super().__init__(ps, config, level, replica, **kwargs)
        self.applier_group = group_id(level, ps.tiers[level].shared)
        self._applier = _kafka().Consumer({**self._settings, "group.id": self.applier_group})

    def _group(self, tier) -> str:
        if not tier.shared:
            raise InvalidInputError(
                f"the {self.level} tier ({tier.kind}) is not shared: each replica applies its "
                "updates itself and needs no invalidation consumer"
            )
        return f"hps.{self.level}.{self.replica}.cache"

    def close(self, timeout: float = 10.0) -> None:
        try:
            super().close(timeout)
        finally:
            self._applier.close()

    def _apply(self, run: list[_Update]) -> None:
        if not run:
            return
        keys, _ = self._merged(run)
        if not self._wait_applied(run):
            return  # stopping: not done, read again on the next start
        try:
            self.ps.notify_update(run[0].topic, keys, None)
        except Exception as exc:  # a listener's bug must not stop the ones behind it
            for one in run:
                self._skip(one.message, "errors", exc)
            return
        self._done(run, keys)

    def _wait_applied(self, run: list[_Update]) -> bool:
        """Wait until the applying group committed past every message of ``run``, or until
        :data:`APPLIED_WAIT_S` after the newest was published; False when stopping."""
        kafka = _kafka()
        last: dict[tuple[str, int], int] = {}
        published = 0.0
        for one in run:
            m = one.message
            last[(m.topic(), m.partition())] = max(last.get((m.topic(), m.partition()), -1),
                                                   m.offset())  # fmt: skip
            kind, ms = m.timestamp()
            published = max(published, ms / 1000 if kind else time.time())
        deadline = published + APPLIED_WAIT_S
        wait = 0.01
        while not self._stop.is_set():
            try:
                committed = self._applier.committed(
                    [kafka.TopicPartition(t, p) for t, p in last], timeout=5
                )
                behind = [tp for tp in committed if tp.offset <= last[(tp.topic, tp.partition)]]
            except Exception as exc:  # the broker may be away: wait and ask again
                log.warning("kafka updates (%s): reading %s's offsets failed: %s",
                            self.level, self.applier_group, exc)  # fmt: skip
                behind = list(last)
            if not behind:
                return True
            if time.time() >= deadline:
                log.warning("kafka updates (%s): %s has not applied %d partitions of %s "
                            "%.0f s after publication; dropping the keys from the caches anyway",
                            self.level, self.applier_group, len(behind), run[0].topic,
                            APPLIED_WAIT_S)  # fmt: skip
                return True
            self._stop.wait(wait)
            wait = min(wait * 2, 0.2)
        return False


def start_update_consumers(ps, source, replica: str | None = None) -> list[UpdateConsumer]:
    """The running consumers of a parameter server whose ``ps.json`` ``update_source`` is
    ``source``: one :class:`UpdateConsumer` per tier level that takes updates, plus an
    :class:`InvalidationConsumer` for each of those levels whose tier is shared.  None when
    ``source`` is not a Kafka one."""
    if not isinstance(source, KafkaUpdateSourceConfig):
        return []
    consumers: list[UpdateConsumer] = []
    try:
        for level, tier in ps.tiers.items():
            if tier.read_only or not ps.update_filters(level):
                continue
            consumers.append(UpdateConsumer(ps, source, level, replica).start())
            if tier.shared:
                consumers.append(InvalidationConsumer(ps, source, level, replica).start())
    except BaseException:
        for consumer in consumers:
            consumer.close()
        raise
    for consumer in consumers:
        log.info("kafka updates: %s %s tier reads %s as group %s", type(consumer).__name__,
                 consumer.level, consumer.pattern, consumer.group)  # fmt: skip
    return consumers
