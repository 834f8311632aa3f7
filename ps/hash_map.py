"""The in-process volatile tiers: ``hash_map`` (one partition) and ``parallel_hash_map``,
and their ``ps.json`` configs.

Each table is split into ``num_partitions`` :class:`~tierserve.ps.hash_table.HashTable`
partitions by :func:`~tierserve.ps.partition.partition_of`; the parallel variant works the
partitions of one call in a thread pool (the compiled kernels release the GIL), the calling
thread taking one partition itself.  A lookup groups the keys by partition in one kernel
(:func:`~tierserve.ps.hash_kernels.group_by_partition`) and each partition's kernel writes its
rows straight into the request-ordered result.  Overflow handling runs per partition after
each insert.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

import numpy as np
from pydantic import Field

from tierserve.core.errors import ConfigError, InvalidInputError, NotFoundError

from .aligned import cache_aligned
from .config_base import (
    UNBOUNDED,
    DatabaseType_t,
    InProcessConfig,
    PositiveInt,
    default_num_partitions,
)
from .eviction import check_ttl_policy, make_policy, resolution_size
from .hash_kernels import group_by_partition
from .hash_table import HashTable
from .partition import as_keys
from .tier import Tier


class HashMapConfig(InProcessConfig):
    """In-process hash map, one partition."""

    type: Literal[DatabaseType_t.hash_map] = DatabaseType_t.hash_map
    num_partitions: Literal[1] = 1


class ParallelHashMapConfig(InProcessConfig):
    """In-process hash map split into partitions that are worked in parallel."""

    type: Literal[DatabaseType_t.parallel_hash_map] = DatabaseType_t.parallel_hash_map
    num_partitions: PositiveInt = Field(default_factory=default_num_partitions)


class HashMapTier(Tier):
    """``hash_map`` / ``parallel_hash_map``: embeddings in this process's memory."""

    configs = (HashMapConfig, ParallelHashMapConfig)
    shared = False  # each process holds its own copy
    read_only = False

    def __init__(self, config: HashMapConfig | ParallelHashMapConfig) -> None:
        self.kind = config.type.value
        super().__init__()
        self.config = config
        self.num_partitions = int(config.num_partitions)
        self.refresh_after_fetch = bool(config.refresh_time_after_fetch)
        self.policy = make_policy(config.overflow_policy)
        self.overflow_margin = int(config.overflow_margin)
        self.resolution_target = resolution_size(
            self.overflow_margin, config.overflow_resolution_target
        )
        self._tables: dict[str, list[HashTable]] = {}
        self._ttl: dict[str, float] = {}  # tables with a time-to-live: seconds
        self._lock = threading.Lock()
        self._rng = np.random.default_rng()
        self._pool = None
        if self.num_partitions > 1:
            workers = min(self.num_partitions, os.cpu_count() or 1)
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix=f"tierserve-{self.kind}")

    # --- tables ----------------------------------------------------------------------------

    def create_table(self, tag: str, dim: int) -> None:
        with self._lock:
            parts = self._tables.get(tag)
            if parts is not None:
                if parts[0].dim != dim:
                    raise InvalidInputError(f"table {tag} exists with dim {parts[0].dim}, not {dim}")
                return
            # Without a margin nothing is ever evicted: keep no access statistics at all.
            track = self.policy.track if self.overflow_margin < UNBOUNDED else None
            self._tables[tag] = [HashTable(dim, track=track) for _ in range(self.num_partitions)]

    def set_ttl(self, tag: str, seconds: float | None) -> None:
        """:meth:`Tier.set_ttl`: the table's partitions keep their rows' access times
        (before its rows load; a TTL needs them, so it refuses ``evict_least_used``)."""
        if seconds is None:
            return
        check_ttl_policy(self.policy, self.kind)
        parts = self._parts(tag)
        with self._lock:
            if not parts[0].clocked:
                if any(len(p) for p in parts):
                    raise ConfigError(f"ttl_seconds must be set on {tag} before its rows load")
                self._tables[tag] = [HashTable(parts[0].dim, track="recency", clock=True)
                                     for _ in parts]  # fmt: skip
            self._ttl[tag] = float(seconds)

    def contains(self, tag: str, keys) -> np.ndarray:
        parts = self._parts(tag)
        keys = as_keys(keys)
        if len(parts) == 1:
            return parts[0].contains(keys)
        order, bounds = group_by_partition(keys, len(parts))
        found = np.empty(keys.size, dtype=bool)
        for p in range(len(parts)):
            sel = order[bounds[p] : bounds[p + 1]]
            found[sel] = parts[p].contains(keys[sel])
        return found

    def expire(self, tag: str, keep=None) -> np.ndarray:
        seconds = self._ttl.get(tag)
        parts = self._tables.get(tag)
        if seconds is None or parts is None or not parts[0].clocked:
            return np.empty(0, dtype=np.int64)
        gone = np.concatenate([p.expire(seconds) for p in parts])
        self.stats.expired += gone.size
        return gone

    def dim(self, tag: str) -> int | None:
        parts = self._tables.get(tag)
        return None if parts is None else parts[0].dim

    def tables(self) -> list[str]:
        return list(self._tables)

    def drop_table(self, tag: str) -> None:
        with self._lock:
            self._tables.pop(tag, None)
            self._ttl.pop(tag, None)

    def nbytes(self, tag: str) -> int:
        """Bytes of memory table ``tag`` holds (index and vectors)."""
        return sum(p.nbytes for p in self._parts(tag))

    # --- data ------------------------------------------------------------------------------

    def _parts(self, tag: str) -> list[HashTable]:
        parts = self._tables.get(tag)
        if parts is None:
            raise NotFoundError(f"{self.kind} tier has no table {tag!r}")
        return parts

    def _map(self, fn, n: int) -> None:
        if self._pool is None or n == 1:
            for p in range(n):
                fn(p)
        else:  # the calling thread works partition 0 while the pool works the others
            futures = [self._pool.submit(fn, p) for p in range(1, n)]
            try:
                fn(0)
            finally:
                for f in futures:
                    f.result()

    def lookup(self, tag: str, keys) -> tuple[np.ndarray, np.ndarray]:
        parts = self._parts(tag)
        return self._lookup(parts, as_keys(keys), parts[0].dim, 0, self._refresh(tag))

    def lookup_decoded(self, tag: str, keys, codec) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`Tier.lookup_decoded`: the kernels decode the rows as they copy them."""
        parts = self._parts(tag)
        if parts[0].dim != codec.words:
            raise InvalidInputError(f"table {tag} holds rows of {parts[0].dim} words, not {codec}")
        return self._lookup(parts, as_keys(keys), codec.dim, codec.layout, self._refresh(tag))

    def _refresh(self, tag: str) -> bool:
        """Whether lookups stamp their rows' access time: ``refresh_time_after_fetch``, and
        always in a table with a TTL (it counts from the last update or lookup)."""
        return self.refresh_after_fetch or tag in self._ttl

    def _lookup(self, parts: list[HashTable], keys: np.ndarray, width: int, layout: int,
                refresh: bool):  # fmt: skip
        """``(rows [n, width], found)``; ``layout`` decodes stored rows (0: as stored)."""
        with self.stats.timed("lookup"):
            if len(parts) == 1:
                emb = cache_aligned((keys.size, width), np.float32)
                found = np.empty(keys.size, dtype=bool)
                hits = parts[0].lookup_into(keys, None, emb, found, refresh, layout)
            else:
                emb, found, hits = self._lookup_partitioned(parts, keys, width, layout, refresh)
            self.stats.hits += hits
            self.stats.misses += keys.size - hits
            return emb, found

    def _lookup_partitioned(self, parts: list[HashTable], keys: np.ndarray, width: int,
                            layout: int, refresh: bool):  # fmt: skip
        order, bounds = group_by_partition(keys, len(parts))
        emb = cache_aligned((keys.size, width), np.float32)
        grouped = np.empty(keys.size, dtype=bool)  # found flags in partition order
        hits = [0] * len(parts)

        def work(p: int) -> None:
            # Each partition writes its rows straight to request order: all in parallel.
            a, b = bounds[p], bounds[p + 1]
            if b > a:
                hits[p] = parts[p].lookup_into(keys, order[a:b], emb, grouped[a:b], refresh,
                                               layout)  # fmt: skip

        self._map(work, len(parts))
        found = np.empty(keys.size, dtype=bool)
        found[order] = grouped
        return emb, found, sum(hits)

    def insert(self, tag: str, keys, embeddings) -> None:
        parts = self._parts(tag)
        keys, embeddings = self._check_insert(keys, embeddings, parts[0].dim, tag)
        with self.stats.timed("insert"):
            if len(parts) == 1:
                parts[0].insert(keys, embeddings)
                self._resolve_overflow(parts[0])
            else:
                order, bounds = group_by_partition(keys, len(parts))
                sorted_keys, sorted_emb = keys[order], embeddings[order]

                def work(p: int) -> None:
                    b0, b1 = bounds[p], bounds[p + 1]
                    if b1 > b0:
                        parts[p].insert(sorted_keys[b0:b1], sorted_emb[b0:b1])
                        self._resolve_overflow(parts[p])

                self._map(work, len(parts))
            self.stats.inserts += keys.size

    def load_table(self, tag: str, keys, embeddings, chunk: int = 0) -> None:
        """Replace table ``tag``'s content in one bulk pass per partition."""
        parts = self._parts(tag)
        keys, embeddings = self._check_insert(keys, embeddings, parts[0].dim, tag)
        with self.stats.timed("load"):
            if len(parts) == 1:
                parts[0].load(keys, embeddings)
                self._resolve_overflow(parts[0])
            else:
                order, bounds = group_by_partition(keys, len(parts))

                def work(p: int) -> None:
                    sel = order[bounds[p] : bounds[p + 1]]
                    parts[p].load(keys[sel], embeddings[sel])
                    self._resolve_overflow(parts[p])

                self._map(work, len(parts))
            self.stats.inserts += keys.size

    def _resolve_overflow(self, table: HashTable) -> None:
        if len(table) > self.overflow_margin:
            self.stats.evictions += table.evict_to(self.resolution_target, self.policy, self._rng)

    def evict(self, tag: str, keys) -> int:
        parts = self._parts(tag)
        keys = as_keys(keys)
        if len(parts) == 1:
            return parts[0].remove(keys)
        order, bounds = group_by_partition(keys, len(parts))
        sorted_keys = keys[order]
        return sum(
            parts[p].remove(sorted_keys[bounds[p] : bounds[p + 1]]) for p in range(len(parts))
        )

    def size(self, tag: str) -> int:
        parts = self._tables.get(tag)
        return 0 if parts is None else sum(len(p) for p in parts)

    def partition_sizes(self, tag: str) -> list[int]:
        """How many keys each partition of ``tag`` holds."""
        return [len(p) for p in self._parts(tag)]

    def list_keys(self, tag: str) -> np.ndarray:
        parts = self._tables.get(tag)
        if not parts:
            return np.empty(0, dtype=np.int64)
        return np.concatenate([p.keys() for p in parts])

    def close(self) -> None:
        with self._lock:
            self._tables.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
