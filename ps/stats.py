"""Per-tier counters and latency histograms, as plain Python objects.

Each tier owns a :class:`TierStats`; the server reads :meth:`TierStats.snapshot` (or the
objects themselves) and exports them.  Updates are a few integer additions per call, never
per key; under CPython's GIL a lost increment between racing threads is possible but rare,
which is acceptable for monitoring.
"""

from __future__ import annotations

import bisect
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

#: Histogram bucket upper bounds in seconds (Prometheus style; the last bucket is +Inf).
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0,
)


@dataclass
class LatencyHistogram:
    """A cumulative-bucket latency histogram in seconds."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    count: int = 0
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.count += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[float, int]]:
        """``[(upper_bound, observations <= bound), ...]`` ending with ``(inf, count)``."""
        out, running = [], 0
        for bound, c in zip((*self.buckets, float("inf")), self.counts):
            running += c
            out.append((bound, running))
        return out

    def quantile(self, q: float) -> float:
        """An upper-bound estimate of the ``q`` quantile (the bucket bound it falls in)."""
        if not self.count:
            return 0.0
        rank = q * self.count
        for bound, running in self.cumulative():
            if running >= rank:
                return bound
        return float("inf")


@dataclass
class TierStats:
    """Counters and per-operation latency histograms of one tier.

    ``hits``/``misses`` count keys found/not found by lookups; ``errors`` counts failed
    backend calls (a lookup that lost a Redis node counts once per failed node call);
    ``evictions`` counts keys removed by overflow handling; ``inserts`` counts keys written;
    ``skipped`` counts keys a lookup did not ask for because their backend was being skipped
    after repeated failures (circuit open; they also count as misses); ``refilled`` counts keys
    written back after a node came back empty (:mod:`tierserve.ps.refill`); ``admitted`` and
    ``held_back`` count keys of online updates of ids the tier did not store yet that were
    written, or held back by the table's ``min_update_count`` (:mod:`tierserve.ps.id_admission`);
    ``expired`` counts rows removed because their table's ``ttl_seconds`` passed.
    """

    tier: str
    hits: int = 0
    misses: int = 0
    errors: int = 0
    evictions: int = 0
    inserts: int = 0
    skipped: int = 0
    refilled: int = 0
    admitted: int = 0
    held_back: int = 0
    expired: int = 0
    latency: dict[str, LatencyHistogram] = field(default_factory=dict)

    def histogram(self, op: str) -> LatencyHistogram:
        h = self.latency.get(op)
        if h is None:
            h = self.latency[op] = LatencyHistogram()
        return h

    @contextmanager
    def timed(self, op: str):
        """Time the enclosed block into the ``op`` histogram."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.histogram(op).observe(time.perf_counter() - start)

    def snapshot(self) -> dict:
        """A JSON-ready copy of the counters and histograms."""
        return {
            "tier": self.tier,
            "hits": self.hits,
            "misses": self.misses,
            "errors": self.errors,
            "evictions": self.evictions,
            "inserts": self.inserts,
            "skipped": self.skipped,
            "refilled": self.refilled,
            "admitted": self.admitted,
            "held_back": self.held_back,
            "expired": self.expired,
            "latency": {
                op: {"count": h.count, "sum": h.total, "buckets": h.cumulative()}
                for op, h in self.latency.items()
            },
        }
