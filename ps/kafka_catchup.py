"""When an update consumer has read what its topics held at its start: the server's readiness.

A server that restarts loads its tables from the version's files, then replays the updates
published since (:mod:`tierserve.ps.update_replay`).  Until the replay is done its tables are
older than what it served before, so it must not say it is ready.  At its start each
applying consumer reads the end offset (high watermark) of every partition of the topics it
subscribes to (:meth:`TopicAdmin.end_offsets <tierserve.ps.kafka_topics.TopicAdmin.
end_offsets>`), and it is *caught up* once, for each of those partitions whose model the
server serves:

- it brought the partition up to date for the served version (rewound it to the first
  update since the version's files, when it has to) and then handled (applied, or skipped
  as older than the files) every message before that end offset; or
- the partition is read by another member of its group (a shared tier: another replica
  writes the shared tables), or the version is never replayed (it attached to tables another
  process loaded), and the group committed that end offset.

A partition of a model the server does not serve does not count (nothing of it is served).
While no broker answers the end offsets are unknown and the consumer is not caught up.
A partition that reached its end offset is forgotten: updates published later are lag
(``tierserve_update_consumer_lag``), not a restart's replay.  A model that loads later (its
partitions paused until then) counts from when it is served until its partitions reach the
offsets seen at start.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (topic, partition)


class CatchUp:
    """The end offsets a consumer saw at its start, and how far it got (see the module
    docstring).

    The consumer's thread calls :meth:`check` between batches (it forgets the partitions that
    reached their targets); any thread may ask :meth:`status`, which judges the partitions
    left by the consumer's state at that moment, so a model that became served a moment ago
    counts at once.
    """

    def __init__(self, name: str, needed: bool = True) -> None:
        self.name = name
        #: partition -> end offset seen at start, until reached; None: not read yet
        self.targets: dict[Key, int] | None = None if needed else {}
        self.error: str | None = None  # why the targets could not be read
        #: the next offset the consumer handles, per partition, for the served version
        self.handled: dict[Key, int] = {}
        self.committed: dict[Key, int] = {}  # the group's committed offsets, as last read
        self._count = 0
        self._started = time.monotonic()
        self._logged = not needed

    def set_targets(self, targets: dict[Key, int]) -> None:
        self.targets, self._count, self.error = dict(targets), len(targets), None
        log.info("%s: to read %d partitions up to their end offsets before it is ready",
                 self.name, self._count)  # fmt: skip

    def add_targets(self, targets: dict[Key, int]) -> None:
        """Also read ``targets`` (the partitions of models served from now on), except those
        already counted."""
        added = {k: v for k, v in targets.items() if k not in self.targets}
        if not added:
            return
        self.targets.update(added)
        self._count += len(added)
        self._logged = False
        log.info("%s: to read %d more partitions up to their end offsets before it is ready",
                 self.name, len(added))  # fmt: skip

    def unknown(self, exc: BaseException | str) -> None:
        """The end offsets could not be read (no broker answers): tried again later."""
        self.error = f"cannot read the end offsets of its topics yet: {exc}"

    def drop_topics(self, topics) -> None:
        """Forget the targets of ``topics`` (deleted and created again: read from their
        start; what the old topic held says nothing of the new one)."""
        if self.targets is not None:
            self.targets = {k: v for k, v in self.targets.items() if k[0] not in topics}
        for key in [k for k in self.handled if k[0] in topics]:
            del self.handled[key]

    def _short(self, state) -> tuple[list[tuple[Key, int, int]], list[Key], list[Key]]:
        """``(short, ask, reached)``: the counted partitions short of their targets as
        ``(key, reached offset, target)``, those of them whose group's committed offset
        counts, and the partitions that reached their targets.

        ``state(key)``: None when the partition's model is not served (it does not count
        now), ``"local"`` when this consumer's handled offset counts, ``"group"`` when the
        group's committed offset counts too, ``"waiting"`` when the consumer has not brought
        the partition up to date for the served version yet (neither counts).
        """
        short, ask, reached = [], [], []
        for key, end in list((self.targets or {}).items()):
            how = state(key)
            if how is None:
                continue
            local = self.handled.get(key, -1) if how != "waiting" else -1
            group = self.committed.get(key, -1) if how == "group" else -1
            if max(local, group) >= end:
                reached.append(key)
                continue
            short.append((key, max(local, group, 0), end))
            if how == "group":
                ask.append(key)
        return short, ask, reached

    def check(self, state, read_committed=None) -> None:
        """Forget the partitions that reached their targets (the consumer's thread only);
        ``read_committed(keys)``: the group's committed offsets, when they may be read now."""
        if self.targets is None or (not self.targets and self._logged):
            return
        short, ask, reached = self._short(state)
        if ask and read_committed is not None:
            self.committed.update(read_committed(ask))
            short, _, reached = self._short(state)
        for key in reached:
            self.targets.pop(key, None)
        if not self.targets and not self._logged:
            self._logged = True
            log.info("%s: read its %d partitions up to the end offsets seen at start in "
                     "%.2f s", self.name, self._count, time.monotonic() - self._started)  # fmt: skip

    def status(self, state) -> tuple[bool, str | None]:
        """``(caught up, why not)`` as the consumer stands now (any thread)."""
        if self.targets is None:
            return False, self.error or "reading the end offsets of its topics"
        short, _, _ = self._short(state)
        if not short:
            return True, None
        (topic, partition), at, end = short[0]
        return False, (f"replaying updates: {len(short)} partitions short of the end offsets "
                       f"seen at start ({topic} partition {partition} at offset {at} of "
                       f"{end})")  # fmt: skip
