"""Expiry of rows not used for a table's ``ttl_seconds``: the parameter server's sweep.

A table with ``ttl_seconds`` (``ps.json`` model entry) has every writable tier keep the last
write or lookup time of each row (:meth:`~tierserve.ps.tier.Tier.set_ttl`; lookups then always
refresh it, whatever ``refresh_time_after_fetch`` says).  :class:`ExpirySweeper`, a thread the
parameter server owns, calls each tier's :meth:`~tierserve.ps.tier.Tier.expire` for each such
table every :func:`sweep_interval` seconds, off the request path, and tells the update
listeners (embedding caches) to drop the expired keys.  The volatile tier is swept first; the
persistent tier, which lookups answered in front of it never reach, keeps (and re-times) the
rows the volatile tier still holds.  An expired id then reads as the
table's default vector, as an unknown id does; tiers count the rows in ``stats.expired``
(``tierserve_tier_expired_total``).  A row lives between its TTL and its TTL plus one sweep
interval after its last use.
"""

from __future__ import annotations

import logging
import threading

from tierserve.core.errors import BackendUnavailableError, NotFoundError

log = logging.getLogger(__name__)

#: Sweeps per TTL (the shortest TTL of the served tables), within these bounds in seconds.
SWEEPS_PER_TTL = 4
MIN_INTERVAL_S = 0.05
MAX_INTERVAL_S = 60.0
#: How often to look for tables with a TTL while none is served.
IDLE_INTERVAL_S = 1.0


def sweep_interval(ttls) -> float:
    """Seconds between sweeps for tables with TTLs ``ttls`` (none: :data:`IDLE_INTERVAL_S`)."""
    ttls = [t for t in ttls if t is not None]
    if not ttls:
        return IDLE_INTERVAL_S
    return min(max(min(ttls) / SWEEPS_PER_TTL, MIN_INTERVAL_S), MAX_INTERVAL_S)


class ExpirySweeper:
    """The thread that expires the rows of every served table with a TTL (see the module)."""

    def __init__(self, ps) -> None:
        self.ps = ps
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tierserve-expiry", daemon=True)

    def start(self) -> ExpirySweeper:
        self._thread.start()
        return self

    def _tables(self):
        """``(model name, TableSpec)`` of every live version's tables that have a TTL."""
        seen = set()
        for version in list(self.ps._versions):
            if version.dropped:
                continue
            for spec in version.tables.values():
                if spec.ttl is not None and spec.storage not in seen:
                    seen.add(spec.storage)
                    yield version.name, spec

    def sweep(self) -> int:
        """Expire once in every writable tier; returns the rows removed."""
        total = 0
        volatile = self.ps.volatile
        for model, spec in list(self._tables()):
            for level, tier in self.ps.tiers.items():
                if tier.read_only:
                    continue
                keep = None
                if level == "persistent" and volatile is not None:
                    # Lookups the volatile tier answers never reach this one: a row it
                    # still holds is in use, and its time here restarts instead.
                    def keep(keys, storage=spec.storage):
                        return volatile.contains(storage, keys)
                try:
                    keys = tier.expire(spec.storage, keep)
                except (BackendUnavailableError, NotFoundError) as exc:  # dropped meanwhile
                    log.debug("expiry of %s in %s skipped: %s", spec.storage, tier.kind, exc)
                    continue
                if keys.size:
                    total += int(keys.size)
                    self.ps._notify(model, spec.name, keys, None)
        return total

    def _run(self) -> None:
        while True:
            interval = sweep_interval(spec.ttl for _, spec in self._tables())
            if self._stop.wait(interval):
                return
            try:
                self.sweep()
            except Exception:  # a bug must not stop expiry for good
                log.exception("expiry sweep failed")

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
