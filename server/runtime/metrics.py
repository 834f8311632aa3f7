"""Prometheus metrics of one server, in a registry of its own (so tests can build many apps).

Under worker processes (``PROMETHEUS_MULTIPROC_DIR`` set, :mod:`tierserve.server.workers`) the
request,
error, latency and batch metrics are written to that folder by every worker and a scrape
sums them over the workers (prometheus-client's multiprocess mode); the collected statistics
below are the answering worker's.

Requests, errors and latency by model and protocol; batch sizes by model; the embedding
cache hit rate per model and table (:meth:`ServerMetrics.add_source`) and per-tier latency,
hits, misses, errors and online updates of the parameter server, and the state of its Kafka
consumers (:meth:`ServerMetrics.add_tier_source`), read at scrape time.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)

#: A model source yields ``{"model": name, "cache_hit_rate": {table: rate}}`` per model.
StatsSource = Callable[[], Iterable[dict[str, Any]]]
#: A tier source returns ``{level: TierStats.snapshot()}`` (see ``tierserve.ps.stats``), with
#: ``"updates": {outcome: count}`` for a level that reads Kafka updates and ``"consumers"``: a
#: list of ``{"role", "alive", "restarts", ...}`` (``tierserve.ps.kafka_consumer.ConsumerStatus``).
TierSource = Callable[[], dict[str, dict[str, Any]]]


#: The per-tier counters: (metric name, help, key of the tier snapshot).
_TIER_COUNTERS = (
    ("tierserve_tier_errors", "Failed backend calls per storage tier", "errors"),
    ("tierserve_tier_hits", "Keys found per storage tier", "hits"),
    ("tierserve_tier_misses", "Keys not found per storage tier", "misses"),
    (
        "tierserve_tier_skipped",
        "Keys a lookup did not ask a storage tier for because it kept failing (circuit "
        "open); they fell through to the next tier or the default vector",
        "skipped",
    ),
    (
        "tierserve_tier_admitted",
        "Keys of online updates of ids the tier did not store yet that were written "
        "(admitted by the table's min_update_count)",
        "admitted",
    ),
    (
        "tierserve_tier_held_back",
        "Keys of online updates of ids the tier does not store yet that were not written: "
        "fewer than the table's min_update_count updates of them so far",
        "held_back",
    ),
    (
        "tierserve_tier_expired",
        "Rows removed because their table's ttl_seconds passed since their last write or "
        "lookup",
        "expired",
    ),
)


class _TierCollector(Collector):
    """The statistics read at scrape time: the cache hit rate of each model
    (:func:`_cache_families`), the online updates and their Kafka consumers of each tier
    (:func:`_update_families`), and each tier's counters and latency
    (:func:`_tier_families`)."""

    def __init__(self) -> None:
        self.sources: list[StatsSource] = []
        self.tier_sources: list[TierSource] = []

    def collect(self):
        yield _cache_families(self.sources)
        tiers = [
            (f"{level}:{snap.get('tier', '')}", snap)
            for source in list(self.tier_sources)
            for level, snap in source().items()
        ]
        yield from _update_families(tiers)
        yield from _tier_families(tiers)


def _cache_families(sources: list[StatsSource]) -> GaugeMetricFamily:
    hit = GaugeMetricFamily(
        "tierserve_cache_hit_rate",
        "Embedding cache hit rate since the model version loaded",
        labels=["model", "table"],
    )
    for source in list(sources):
        for stats in source():
            for table, rate in stats.get("cache_hit_rate", {}).items():
                hit.add_metric([stats["model"], table], rate)
    return hit


def _tier_families(tiers: list[tuple[str, dict[str, Any]]]):
    """The counters of :data:`_TIER_COUNTERS` and the operation latency, per tier."""
    counters = [
        (CounterMetricFamily(name, text, labels=["tier"]), key)
        for name, text, key in _TIER_COUNTERS
    ]
    latency = HistogramMetricFamily(
        "tierserve_tier_latency_seconds",
        "Latency of storage-tier operations (lookup, insert, ...)",
        labels=["tier", "op"],
    )
    for tier, snap in tiers:
        for family, key in counters:
            family.add_metric([tier], snap.get(key, 0))
        for op, h in snap.get("latency", {}).items():
            latency.add_metric([tier, op], buckets=_buckets(h), sum_value=h["sum"])
    for family, _ in counters:
        yield family
    yield latency


def _update_families(tiers: list[tuple[str, dict[str, Any]]]):
    """Online updates by outcome and the state of the Kafka consumers, per tier."""
    updates = CounterMetricFamily(
        "tierserve_tier_updates",
        "Online updates read from Kafka per storage tier, by outcome: messages applied, "
        "keys applied, malformed, rejected (no such table, refused keys), retries, errors",
        labels=["tier", "outcome"],
    )
    alive = GaugeMetricFamily(
        "tierserve_update_consumers_alive",
        "Kafka update consumers whose loop runs, per storage tier and role (apply: writes "
        "the tier; invalidate: tells this replica's caches of another replica's writes)",
        labels=["tier", "role"],
    )
    caught_up = GaugeMetricFamily(
        "tierserve_update_consumers_caught_up",
        "Kafka update consumers that read their topics up to the end offsets seen when "
        "they started (the replay after a restart); the server is ready only when all are",
        labels=["tier", "role"],
    )
    restarts = CounterMetricFamily(
        "tierserve_update_consumer_restarts",
        "Times a Kafka update consumer's loop failed and was restarted",
        labels=["tier", "role"],
    )
    lag = GaugeMetricFamily(
        "tierserve_update_consumer_lag",
        "Update messages published but not yet read, per storage tier, consumer role and "
        "topic partition",
        labels=["tier", "role", "topic", "partition"],
    )
    waiting = GaugeMetricFamily(
        "tierserve_update_partitions_waiting",
        "Topic partitions whose model is not loaded yet: their updates wait (unread, "
        "uncommitted) until it is",
        labels=["tier"],
    )
    kafka_down = GaugeMetricFamily(
        "tierserve_update_kafka_down",
        "1 while the Kafka update consumers of a storage tier reach no broker",
        labels=["tier"],
    )
    freshness = HistogramMetricFamily(
        "tierserve_update_freshness_seconds",
        "Online update message timestamp to applied in the tier and visible to predictions",
        labels=["tier"],
    )
    for tier, snap in tiers:
        for outcome, count in snap.get("updates", {}).items():
            updates.add_metric([tier, outcome], count)
        by_role: dict[str, list[int]] = {}
        for consumer in snap.get("consumers", ()):
            counts = by_role.setdefault(consumer["role"], [0, 0, 0])
            counts[0] += bool(consumer["alive"])
            counts[1] += consumer["restarts"]
            counts[2] += bool(consumer.get("caught_up", True))
        for role, (n_alive, n_restarts, n_caught_up) in by_role.items():
            alive.add_metric([tier, role], n_alive)
            restarts.add_metric([tier, role], n_restarts)
            caught_up.add_metric([tier, role], n_caught_up)
        _consumer_metrics(snap, tier, lag, waiting, kafka_down, freshness)
    yield from (updates, alive, caught_up, restarts, lag, waiting, kafka_down, freshness)


def _consumer_metrics(snap, tier, lag, waiting, kafka_down, freshness) -> None:
    consumers = snap.get("consumers", ())
    if not consumers:
        return
    for consumer in consumers:
        for topic, partition, behind in consumer.get("lag", ()):
            lag.add_metric([tier, consumer["role"], topic, str(partition)], behind)
    applying = [c for c in consumers if c.get("freshness") is not None]
    waiting.add_metric([tier], sum(c.get("waiting", 0) for c in applying))
    kafka_down.add_metric([tier], float(any(c.get("kafka_down") for c in consumers)))
    for consumer in applying:
        freshness.add_metric([tier], buckets=_buckets(consumer["freshness"]),
                             sum_value=consumer["freshness"]["sum"])  # fmt: skip


def _buckets(histogram: dict[str, Any]) -> list[tuple[str, int]]:
    """A snapshot histogram's buckets as prometheus-client takes them (``+Inf`` last)."""
    return [("+Inf" if b == float("inf") else str(b), n) for b, n in histogram["buckets"]]


class ServerMetrics:
    """The server's metrics and their registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "tierserve_requests",
            "Inference and control requests",
            ["model", "protocol"],
            registry=self.registry,
        )
        self.errors = Counter(
            "tierserve_request_errors",
            "Requests that failed, by status",
            ["model", "protocol", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "tierserve_request_latency_seconds",
            "End-to-end request latency inside the server",
            ["model", "protocol"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.batch_size = Histogram(
            "tierserve_batch_size",
            "Rows per model execution (after dynamic batching)",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self.batch_requests = Histogram(
            "tierserve_batch_requests",
            "Requests merged into one model execution",
            ["model"],
            buckets=BATCH_BUCKETS,
            registry=self.registry,
        )
        self._children: dict[tuple[str, str], tuple] = {}
        self._batch_children: dict[str, tuple] = {}
        self._tiers = _TierCollector()
        self.registry.register(self._tiers)

    def add_source(self, source: StatsSource) -> None:
        """Read cache and tier statistics from ``source`` at every scrape."""
        self._tiers.sources.append(source)

    def add_tier_source(self, source: TierSource) -> None:
        """Read per-tier counters and latency histograms from ``source`` at every scrape."""
        self._tiers.tier_sources.append(source)

    def prepare_model(self, model: str, protocols: tuple[str, ...] = ("http", "grpc")) -> None:
        """Create ``model``'s request and batch series (at 0) now, not at its first request:
        scrapes see them from the start, and the first request does not build them."""
        if model not in self._batch_children:
            self._batch_children[model] = (self.batch_size.labels(model),
                                           self.batch_requests.labels(model))  # fmt: skip
        for protocol in protocols:
            if (model, protocol) not in self._children:
                self._children[(model, protocol)] = (self.requests.labels(model, protocol),
                                                     self.latency.labels(model, protocol))  # fmt: skip

    def observe_batch(self, model: str, rows: int, requests: int) -> None:
        children = self._batch_children.get(model)
        if children is None:  # model names here are loaded models: a bounded set
            children = (self.batch_size.labels(model), self.batch_requests.labels(model))
            self._batch_children[model] = children
        children[0].observe(rows)
        children[1].observe(requests)

    def observe_request(
        self, model: str, protocol: str, seconds: float, status: str | None = None
    ) -> None:
        children = self._children.get((model, protocol))
        if children is None:
            children = (self.requests.labels(model, protocol), self.latency.labels(model, protocol))
            if len(self._children) < 10_000:  # unknown names are not cached without bound
                self._children[(model, protocol)] = children
        children[0].inc()
        children[1].observe(seconds)
        if status is not None:
            self.errors.labels(model, protocol, status).inc()

    def render(self) -> bytes:
        """The text exposition format (summed over worker processes, see the module
        docstring)."""
        folder = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if not folder:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=folder)
        registry.register(self._tiers)
        return generate_latest(registry)
