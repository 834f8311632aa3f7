"""Counters of one embedding cache, for the server's metrics endpoint."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class CacheMetrics:
    """A snapshot of one table's cache counters (totals since it was created)."""

    model: str
    table: str
    device: str  #: ``"cpu"`` or ``"cuda:<id>"``
    cache_type: str  #: ``"dynamic"`` or ``"static"``
    capacity: int  #: most embeddings the cache can hold
    size: int  #: embeddings held now
    hits: int
    misses: int
    hit_rate: float  #: hits / (hits + misses), 0.0 before the first query
    running_hit_rate: float  #: moving average that picks sync or async inserts
    insert_queue_depth: int  #: batches waiting for the async insert worker
    inserted: int  #: embeddings inserted
    evicted: int  #: embeddings evicted to make room
    dropped_inserts: int  #: async insert batches dropped because the queue was full
    stale_dropped: int  #: fetched embeddings not inserted because an update overtook them
    updates: int  #: parameter-server updates applied to the cache
    refreshed: int  #: embeddings re-pulled by refreshes

    def as_dict(self) -> dict:
        return asdict(self)
