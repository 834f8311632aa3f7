"""Dropping from this process's caches the updates another replica applied to a shared tier.

With a shared tier (Redis), only the replica that applies an update hears of it through
:meth:`~tierserve.ps.hierarchy.HierarchicalParameterServer.insert`; so every replica also
runs an :class:`InvalidationConsumer` (group ``hps.<level>.<replica>.cache``) that reads the
same topics, writes no tier, waits until the applying group ``hps.<level>`` has committed
past each message (so the shared tier holds the update), and then tells this process's
update listeners (its embedding caches) to drop the updated keys.
"""

from __future__ import annotations

import logging
import time

from tierserve.core.errors import InvalidInputError

from .kafka_consumer import ConsumerLoop, Update
from .kafka_groups import group_id
from .kafka_source import KafkaUpdateSourceConfig, confluent_kafka
from .retry import EqualJitterBackoff

log = logging.getLogger(__name__)

#: How long after a message was published an invalidation consumer waits for the applying
#: group to commit past it (then it drops the keys anyway).
APPLIED_WAIT_S = 60.0
#: How long it waits between asks of the applying group's offsets: 10 ms, doubling to 200 ms,
#: jittered (the replicas' invalidation consumers ask the same coordinator).
APPLIED_POLL = EqualJitterBackoff(cap=0.2, base=0.01)


class InvalidationConsumer(ConsumerLoop):
    """Tells this process's update listeners of the updates another replica applies to a
    shared tier (see the module docstring); writes no tier.

    Its group is ``hps.<level>.<replica>.cache``.  For each run of messages it waits until
    the applying group ``hps.<level>`` has committed past them (at most until
    :data:`APPLIED_WAIT_S` after they were published), then calls
    :meth:`~tierserve.ps.hierarchy.HierarchicalParameterServer.notify_update` with no
    vectors: the listeners drop the keys, and their next lookup reads the updated tier.
    """

    role = "invalidate"

    def __init__(self, ps, config: KafkaUpdateSourceConfig, level: str,
                 replica: str | None = None, **kwargs) -> None:  # fmt: skip
        super().__init__(ps, config, level, replica, **kwargs)
        self.applier_group = group_id(level, ps.tiers[level].shared)
        self._applier = confluent_kafka().Consumer({**self._settings, "group.id": self.applier_group})

    def _group(self, tier) -> str:
        if not tier.shared:
            raise InvalidInputError(
                f"the {self.level} tier ({tier.kind}) is not shared: each replica applies its "
                "updates itself and needs no invalidation consumer"
            )
        return f"hps.{self.level}.{self.replica}.cache"

    def _membership(self, tier) -> dict:
        # Its group is this replica's alone, whatever the tier.
        return {"group.instance.id": self.replica} if self._stable_replica else {}

    def close(self, timeout: float = 10.0) -> None:
        try:
            super().close(timeout)
        finally:
            self._applier.close()

    def _apply(self, run: list[Update]) -> None:
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

    def _wait_applied(self, run: list[Update]) -> bool:
        """Wait until the applying group committed past every message of ``run``, or until
        :data:`APPLIED_WAIT_S` after the newest was published; False when stopping."""
        kafka = confluent_kafka()
        last: dict[tuple[str, int], int] = {}
        published = 0.0
        for one in run:
            m = one.message
            last[(m.topic(), m.partition())] = max(last.get((m.topic(), m.partition()), -1),
                                                   m.offset())  # fmt: skip
            kind, ms = m.timestamp()
            published = max(published, ms / 1000 if kind else time.time())
        deadline = published + APPLIED_WAIT_S
        asked = 0
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
            asked += 1
            self._stop.wait(APPLIED_POLL.compute(asked))
        return False
