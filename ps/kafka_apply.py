"""The consumer that applies online updates to one tier level of a parameter server.

:class:`UpdateConsumer` (a :class:`~tierserve.ps.kafka_consumer.ConsumerLoop`) writes each
run of updates with one :meth:`~tierserve.ps.hierarchy.HierarchicalParameterServer.apply_update`
to its level (``volatile`` or ``persistent``):

- an update for a model or table this server does not hold, or one the tier refuses, is
  counted, logged and skipped (its offset committed); a tier that cannot be reached is
  retried after the loop's jittered backoff, ``failure_backoff_ms`` first, growing to
  :data:`~tierserve.ps.kafka_consumer.MAX_RESTART_BACKOFF_S` (the message is not skipped,
  and its offset not committed);
- it reads only the topics of the models this server serves (``expects()``, default: the
  models of ``ps.config``; the repository loader passes the models of its ``ps.json``) that
  its level's filters match (:mod:`tierserve.ps.kafka_subscription`); a partition of such a
  model not loaded yet is paused and read once it is; an update of another model (left
  over from before a re-subscription) is skipped and counted as rejected; a committed
  version is re-read from the first update at or after its creation time
  (:mod:`tierserve.ps.update_replay`), and older updates are skipped as stale;
- at its start it reads the end offsets of its topics and reports itself caught up
  (:meth:`~tierserve.ps.kafka_consumer.ConsumerLoop.status`, hence the server's readiness)
  only once it read them up to there (:mod:`tierserve.ps.kafka_catchup`).
"""

from __future__ import annotations

import logging
import time

from tierserve.core.errors import BackendUnavailableError, InvalidInputError, NotFoundError

from . import update_replay
from .kafka_consumer import APPLY, HOUSEKEEPING_S, STALE, UNSERVED, WAIT, ConsumerLoop, Update
from .kafka_source import confluent_kafka
from .table_tag import parse_table_tag

log = logging.getLogger(__name__)


class UpdateConsumer(ConsumerLoop):
    """Applies the updates of Kafka to tier ``level`` of ``ps``; see the module docstring and
    :class:`~tierserve.ps.kafka_consumer.ConsumerLoop`."""

    role = "apply"

    def _admit(self, message) -> str:
        """Whether to apply ``message`` now, leave it for when its model loads (its partition
        paused), or skip it as older than the served version (:mod:`.update_replay`)."""
        if message.error() is not None:
            return APPLY
        key = (message.topic(), message.partition())
        if key in self._held or key in self._reread:
            return WAIT
        try:
            model, _ = parse_table_tag(key[0])
        except InvalidInputError:
            return APPLY  # refused (and counted) by the insert
        served = self._committed(model)
        if served is None:
            if model not in self.served.models:
                return UNSERVED  # left over from before a re-subscription
            self._hold(key, message.offset())
            return WAIT
        if self._synced_to.get(key) is not served:
            try:
                seeked = self._sync(key, served, message.offset())
            except confluent_kafka().KafkaException as exc:  # the broker did not answer: later
                log.warning("kafka updates (%s): finding where %s partition %s starts for "
                            "model %s generation %d failed (%s); trying again", self.level,
                            *key, served.name, served.generation, exc)  # fmt: skip
                self._consumer.seek(confluent_kafka().TopicPartition(*key, message.offset()))
                seeked = True
            if seeked:
                self._reread.add(key)  # the rest of this batch comes again
                return WAIT
        kind, ms = message.timestamp()
        if kind != confluent_kafka().TIMESTAMP_NOT_AVAILABLE and ms < update_replay.version_time_ms(served):
            return STALE
        return APPLY

    def _committed(self, model: str):
        try:
            return self.ps.model(model)
        except NotFoundError:
            return None

    def _hold(self, key: tuple[str, int], offset: int) -> None:
        """Pause ``key`` and rewind it to ``offset``: its model is not loaded yet."""
        tp = confluent_kafka().TopicPartition(*key, offset)
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
        kafka = confluent_kafka()
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
        tp = confluent_kafka().TopicPartition(*key)
        if self._consumer.position([tp])[0].offset >= 0:
            return False
        return self._consumer.committed([tp], timeout=5)[0].offset < 0

    def _housekeeping(self) -> None:
        """Between batches: resume the partitions whose model loaded, rewind those whose
        model has a new version, measure the lag, and probe the broker during an outage."""
        kafka = confluent_kafka()
        self._follow_served()
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
        if now - self._housekept < HOUSEKEEPING_S:
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
                catchup.set_targets(self._end_offsets(self.pattern))
            except Exception as exc:  # no broker answers: not ready, asked again next time
                catchup.unknown(exc)
                return
        catchup.check(self._catch_up_state, self._group_committed)

    def _end_offsets(self, pattern: str | None) -> dict[tuple[str, int], int]:
        return {} if pattern is None else self._topic_admin().end_offsets(pattern, timeout=1)

    def _models_added(self, models: frozenset[str]) -> None:
        """Models served from now on count towards catching up as they would have at start:
        their partitions must reach the end offsets they have now."""
        if self.catchup.targets is None:
            return  # read with the rest
        try:
            self.catchup.add_targets(self._end_offsets(self.served.pattern_of(models)))
        except Exception as exc:  # no broker answers: their replay does not hold readiness
            log.warning("kafka updates (%s): reading the end offsets of the topics of %s: %s",
                        self.level, sorted(models), exc)  # fmt: skip

    def _group_committed(self, keys) -> dict[tuple[str, int], int]:
        kafka = confluent_kafka()
        try:
            parts = self._consumer.committed([kafka.TopicPartition(*k) for k in keys], timeout=2)
        except kafka.KafkaException as exc:
            log.debug("kafka updates (%s): reading committed offsets: %s", self.level, exc)
            return {}
        return {(tp.topic, tp.partition): tp.offset for tp in parts}

    def _apply(self, run: list[Update]) -> None:
        """Apply the updates of ``run`` (one topic, one dim) with one insert; when the
        insert refuses them, one by one, so that only the bad ones are skipped."""
        if not run:
            return
        keys, embeddings = self._merged(run)
        failures = 0  # tries the tier was unreachable for, in a row
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
                failures += 1
                delay = self.backoff.compute(failures)
                log.warning("kafka updates (%s): %s; retrying in %.3f s", self.level, exc,
                            delay)  # fmt: skip
                self._stop.wait(delay)
                continue
            except Exception as exc:  # a bug must not stop the updates behind these
                for one in run:
                    self._skip(one.message, "errors", exc)
                return
            self._done(run, keys)
            return
