"""The loop every Kafka update consumer runs (see :mod:`tierserve.ps.kafka_updates`).

:class:`ConsumerLoop` owns one Kafka consumer in one group: it subscribes, receives what
arrives within ``poll_timeout_ms`` (or less, once that holds ``receive_buffer_size``
embedding rows), decodes each message, hands runs of consecutive messages of one table to
:meth:`~ConsumerLoop._apply`, and commits the offsets of the messages done (at most every
``max_commit_interval`` messages, and only those done: at least once, in order per
partition).  A malformed message (any value the decoder refuses) is counted, logged (its
first bytes in hex), skipped and committed past.  Should the loop fail anyway (a bug), it
restarts after a growing, jittered backoff (base ``failure_backoff_ms``, at most
:data:`MAX_RESTART_BACKOFF_S`) with a new Kafka client, which reads again from the last
committed offset; a message the loop failed on :data:`MAX_FAILURES_PER_MESSAGE` times in a
row is skipped.  A receive that fails (the Kafka client itself) is tried again after the same
backoff (:mod:`tierserve.ps.retry`).  A topic deleted and created again (a new topic id,
:mod:`tierserve.ps.kafka_topics`) is read from its start by a new Kafka client.

What a run of messages does is the subclass's: :class:`~tierserve.ps.kafka_apply.UpdateConsumer`
writes it to a tier, :class:`~tierserve.ps.kafka_invalidate.InvalidationConsumer` tells this
process's caches.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError

from .kafka_catchup import CatchUp
from .kafka_groups import REPLICA_ENV, group_id, replica_id
from .kafka_log import KafkaLog
from .kafka_receive import Update, decode, hex_head, merged, message_id, receive
from .kafka_source import (
    KafkaUpdateSourceConfig,
    bootstrap_servers,
    confluent_kafka,
    metadata_settings,
)
from .kafka_status import FRESHNESS_BUCKETS, ConsumerStats, ConsumerStatus
from .kafka_subscription import ServedTopics
from .kafka_topics import TopicAdmin
from .retry import Backoff, EqualJitterBackoff
from .stats import LatencyHistogram

log = logging.getLogger(__name__)

#: The longest wait between restarts of a failing consumer loop.
MAX_RESTART_BACKOFF_S = 10.0
#: Failures of the loop on one message after which that message is skipped.
MAX_FAILURES_PER_MESSAGE = 3
#: The longest a fetch waits for data (``fetch.wait.max.ms``): every other request to that
#: broker waits behind it, and a new topic's first update waits for several in a row.
FETCH_WAIT_MAX_MS = 50
HOUSEKEEPING_S = 1.0  # how often lag is measured and a broker outage probed
# what the consumer does with a message
APPLY, WAIT, STALE, UNSERVED = "apply", "wait", "stale", "unserved"


class ConsumerLoop:
    """One Kafka consumer of the updates of tier ``level`` of ``ps``, run in a daemon thread
    (see the module docstring).

    ``start()`` runs it, ``close()`` stops it and commits what was done.  ``replica`` names
    this server in a group of its own (default :func:`~tierserve.ps.kafka_groups.replica_id`);
    ``backoff`` spaces the restarts of a failing loop; ``expects()`` names the models this
    server serves (default: those of ``ps.config``; the models committed in ``ps`` count
    too): it reads the topics of those its level's filters match, and subscribes again when they change
    (:mod:`tierserve.ps.kafka_subscription`).  Subclasses say what a run of messages
    does (:meth:`_apply`), which messages to take now (:meth:`_admit`) and what to do between
    batches (:meth:`_housekeeping`).
    """

    role = ""  # "apply" (writes the tier) or "invalidate" (tells this process's caches)

    def __init__(
        self,
        ps,
        config: KafkaUpdateSourceConfig,
        level: str,
        replica: str | None = None,
        *,
        backoff: Backoff | None = None,
        expects: Callable[[], Iterable[str]] | None = None,
        **options,
    ) -> None:
        if level not in ps.tiers:
            raise InvalidInputError(f"the parameter server has no {level} tier")
        self.ps = ps
        self.config = config
        self.level = level
        self.stats = ConsumerStats()
        # The update source's settings, in the units the loop works in.
        self.poll_timeout_s = config.poll_timeout_ms / 1000
        self.receive_buffer_rows = config.receive_buffer_size
        self.max_batch_keys = config.max_batch_size
        self.max_commit_interval = config.max_commit_interval
        self.failure_backoff_s = config.failure_backoff_ms / 1000
        self.metadata_refresh_s = config.metadata_refresh_interval_ms / 1000
        #: a replica id given (or $TIERSERVE_REPLICA_ID) names the same server after a restart
        self._stable_replica = replica is not None or REPLICA_ENV in os.environ
        self.replica = replica or replica_id()
        self.group = self._group(ps.tiers[level])
        listed = expects or (lambda: [m.model for m in ps.config.models])
        # and the models committed now (an InferenceModel commits its own, outside ps.config)
        self.served = ServedTopics(ps.update_filters(level), lambda: {*listed(), *ps.models()})
        self._unserved: set[str] = set()  # topics of models not served here, logged once
        self.backoff = backoff or EqualJitterBackoff(
            cap=MAX_RESTART_BACKOFF_S, base=max(self.failure_backoff_s, 0.05)
        )
        self.kafka_log = KafkaLog(f"kafka updates ({level}, {self.role})")
        self._settings = self._client_settings(ps.tiers[level], options)
        self._consumer = confluent_kafka().Consumer(self._settings)
        self._init_state()

    def _client_settings(self, tier, options: dict) -> dict:
        """librdkafka's settings of this consumer's client (``options`` added last)."""
        return {
            "bootstrap.servers": bootstrap_servers(self.config.brokers),
            "group.id": self.group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **metadata_settings(self.config),
            # A fetch waits at most this long for data: requests behind it on the connection
            # (metadata, the offset lookups of a new partition or a replay) wait no longer
            # (librdkafka's default: 500 ms); an idle consumer fetches 20 times a second.
            "fetch.wait.max.ms": min(FETCH_WAIT_MAX_MS, self.config.poll_timeout_ms),
            **self._membership(tier),
            **self.kafka_log.client_config(),
            **options,
        }

    def _init_state(self) -> None:
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

    @property
    def pattern(self) -> str | None:
        """The regex of the topics it subscribes to; None while no served model's filter
        matches (it reads nothing)."""
        return self.served.pattern

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

    def start(self) -> ConsumerLoop:
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

    def __enter__(self) -> ConsumerLoop:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

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
        self._consumer = confluent_kafka().Consumer(self._settings)
        self._subscribe()

    def _subscribe(self) -> None:
        self._assigned.clear()
        self._held.clear()
        self._synced_to.clear()
        self.catchup.handled.clear()
        self._listen()

    def _listen(self) -> None:
        """Subscribe to :attr:`pattern` (replacing any earlier subscription), or to nothing."""
        if self.pattern is None:
            self._consumer.unsubscribe()
        else:
            self._consumer.subscribe(
                [self.pattern], on_assign=self._on_assign, on_revoke=self._on_revoke
            )

    def _follow_served(self) -> None:
        """Subscribe again when the served models its filters match changed (a model
        loaded from a ``ps.json`` that names more): the partitions are revoked (what is
        done committed) and the new subscription's assigned."""
        changed = self.served.refresh()
        if changed is None:
            return
        added, removed = changed
        log.info("kafka updates (%s, %s): served models changed (added %s, removed %s); "
                 "subscribing to %s", self.level, self.role, sorted(added), sorted(removed),
                 self.pattern)  # fmt: skip
        self._listen()
        if added:
            self._models_added(added)

    def _on_assign(self, consumer, partitions) -> None:
        recreated = [tp for tp in partitions if tp.topic in self._recreated]
        if recreated:  # its committed offsets are the old topic's: read it from its start
            for tp in recreated:
                tp.offset = confluent_kafka().OFFSET_BEGINNING
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
        failures = 0  # consume calls that failed in a row
        while not self._stop.is_set():
            try:
                self._housekeeping()
                messages = self._receive(self.poll_timeout_s)
            except Exception as exc:  # the client itself failed: back off and go on
                self.stats.errors += 1
                failures += 1
                log.warning("kafka updates (%s): consume failed: %s", self.level, exc)
                self._stop.wait(self.backoff.compute(failures))
                continue
            failures = 0
            if self.kafka_log.down and any(m.error() is None for m in messages):
                self.kafka_log.recovered()
            if not self._handle(messages):
                return
            self._handling = None
            if messages:
                self._progress += 1
            self._commit(asynchronous=True)
            self.catchup.check(self._catch_up_state)

    def _handle(self, messages: list) -> bool:
        """Apply (or skip) ``messages`` in order, consecutive updates of one topic and dim
        with one :meth:`_apply`; False when stopping (the rest is read again on the next
        start: not done, not committed)."""
        self._reread.clear()
        run: list[Update] = []
        run_keys = 0
        for message in messages:
            if self._stop.is_set():
                return False
            verdict = self._admit(message)
            if verdict == WAIT:
                continue  # read again once its model loads (not done, not committed)
            if verdict in (STALE, UNSERVED):
                self._apply(run)  # the messages before it first: offsets stay in order
                run, run_keys = [], 0
                if verdict == STALE:
                    self.stats.stale += 1
                else:
                    self._skip_unserved(message)
                self._applied(message)
                continue
            update = self._take(message)
            if run and (
                update is None  # an error or a malformed value (counted): done alone
                or (update.topic, update.dim) != (run[0].topic, run[0].dim)
                or run_keys + update.keys.size > self.max_batch_keys
            ):
                self._apply(run)
                run, run_keys = [], 0
            if update is None:
                self._applied(message)
                continue
            run.append(update)
            run_keys += update.keys.size
        self._apply(run)
        return True

    def _receive(self, timeout: float) -> list:
        """:func:`~tierserve.ps.kafka_receive.receive` from this loop's client."""
        return receive(self._consumer, timeout, self.receive_buffer_rows)

    def _take(self, message) -> Update | None:
        """:meth:`_decode`, unless the loop already failed on ``message`` too often."""
        if message.error() is None:
            self._handling = message_id(message)
            if self._handling in self._poison:
                self._poison.discard(self._handling)
                self.stats.errors += 1
                log.warning("kafka updates (%s): skipped the message on %s partition %s at "
                            "offset %s (%s): the loop failed on it", self.level,
                            *self._handling, hex_head(message.value()))  # fmt: skip
                return None
        return self._decode(message)

    def _decode(self, message) -> Update | None:
        return decode(message, self.stats, self.kafka_log, self.level)

    _merged = staticmethod(merged)

    def _done(self, run: list[Update], keys: np.ndarray) -> None:
        self.stats.messages += len(run)
        self.stats.keys += int(keys.size)
        now = time.time()
        for one in run:
            kind, ms = one.message.timestamp()
            if kind:  # the insert returned: the rows are in the tier and its caches
                self.freshness.observe(max(now - ms / 1000, 0.0))
            self._applied(one.message)

    def _skip_unserved(self, message) -> None:
        """Count ``message``, of a model this server does not serve, as rejected; log its
        topic once."""
        self.stats.rejected += 1
        if message.topic() not in self._unserved:
            self._unserved.add(message.topic())
            log.info("kafka updates (%s): skipping the updates on %s: this server does not "
                     "serve its model", self.level, message.topic())  # fmt: skip

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
        if self._uncommitted >= self.max_commit_interval:
            self._commit(asynchronous=True)

    def _commit(self, asynchronous: bool) -> None:
        """Commit the offsets after the messages done, and only those (a message consumed
        but not yet applied is read again after a crash)."""
        if not self._positions or self._consumer is None:
            return
        kafka = confluent_kafka()
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

    def _lag(self) -> tuple[tuple[str, int, int], ...]:
        kafka = confluent_kafka()
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

    def _follow_recreated(self) -> None:
        """Every ``metadata_refresh_interval_ms`` (at least a second): when an assigned topic
        was deleted and created again, start a new client that reads it from its start (see
        :mod:`tierserve.ps.kafka_topics`)."""
        now = time.monotonic()
        interval = max(HOUSEKEEPING_S, self.metadata_refresh_s)
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

    # --- what subclasses decide ---------------------------------------------------------------

    def _admit(self, message) -> str:
        """:data:`APPLY` ``message`` now, :data:`WAIT` (read it again later) or skip it as
        :data:`STALE`."""
        return APPLY

    def _apply(self, run: list[Update]) -> None:
        """Handle ``run`` (consecutive updates of one topic and dim) and mark them done."""
        raise NotImplementedError

    def _models_added(self, models: frozenset[str]) -> None:
        """What to do once the topics of ``models`` were added to the subscription."""

    def _housekeeping(self) -> None:
        """Between batches: follow the served models; at most every :data:`HOUSEKEEPING_S`,
        measure the lag and follow topics that were created again."""
        self._follow_served()
        now = time.monotonic()
        if now - self._housekept >= HOUSEKEEPING_S:
            self._housekept = now
            self.lag = self._lag()
            self._follow_recreated()

    def _catch_up_state(self, key: tuple[str, int]) -> str | None:
        """How partition ``key`` counts towards catching up (see ``CatchUp._short``); None:
        it does not count."""
        return None
