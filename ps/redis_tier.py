"""The Redis volatile tier: ``redis_cluster`` (HugeCTR's) and standalone ``redis`` (ours),
and their ``ps.json`` configs.

Layout (docs/formats.md, Files and messages 7): each table is split into ``num_partitions`` partitions by
:func:`~tierserve.ps.partition.partition_of`; partition ``N`` of table ``<tag>`` is the hash
``hps_et{<tag>/pN}v`` (field: the key's 8 little-endian bytes; value: the vector's float32
bytes) and, only when something reads it (an ``overflow_margin`` with ``evict_oldest`` or
``evict_least_used``, or a table's ``ttl_seconds``), ``hps_et{<tag>/pN}t`` (field: the same key
bytes; value: last write/access time in microseconds for ``evict_oldest`` and a TTL, access
count for ``evict_least_used``).  The ``{...}`` hash tag keeps both hashes of a partition on one slot.

Calls group keys by partition, chunk them at ``max_batch_size`` fields per command, and send
one pipeline per node, waiting at most ``socket_timeout_ms`` for it and repeating it up to
``max_retries`` times when the network fails.  A node that cannot be reached during a lookup
costs its keys only: they are reported as not found (the hierarchy falls through), the error
counter rises and a warning is logged.  Each node has a circuit breaker
(:mod:`tierserve.ps.breaker`): after ``failure_threshold`` failed calls in a row the node is
skipped for a back-off that grows while it stays down, then one call probes it: lookups
report its keys as not found (counted as ``skipped``), inserts and evictions raise
:class:`~tierserve.core.errors.BackendUnavailableError` at once (retryable), as they do when
the node cannot be reached.  So a lookup that copies missed vectors up
(``cache_missed_embeddings``) does not wait on a frozen node either.

A cluster's slot map is read again in the background (:mod:`tierserve.ps.topology`) whenever
a call to a node fails, is skipped, or is redirected (``MOVED`` / ``ASK``), at most once per
``topology_refresh_ms``: when a master dies and the cluster promotes its replica, calls go to
the promoted node within that time of the promotion (its breaker is its own, closed), and it
serves the rows it replicated.  Until then the dead master's keys read as not found.

As in HugeCTR, reads refresh the ``t`` hash only when ``refresh_time_after_fetch`` is set
(it costs a write per read); writes always do.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import numpy as np

from tierserve.core.errors import (
    BackendUnavailableError,
    InvalidInputError,
    require_extra,
)

from .breaker import BreakerSet
from .codec import decode_values, key_fields, vector_values
from .config_base import UNBOUNDED
from .eviction import check_ttl_policy, make_policy, resolution_size
from .partition import as_keys, group_by_partition
from .redis_client import network_errors, open_client
from .redis_config import RedisClusterConfig, RedisConfig, RedisTierConfig
from .redis_layout import (
    _COUNT_SCRIPT,
    _EXPIRE_SCRIPT,
    _interleave,
    sentinel_key,
    stat_hash,
    value_hash,
)
from .redis_routing import RETRY_BASE_S, RETRY_CAP_S, NodeRouting
from .retry import EqualJitterBackoff, ExponentialBackoff
from .tier import Tier
from .topology import TopologyRefresher

#: names importers of this module use (their homes: redis_config, redis_layout, redis_routing)
__all__ = [
    "RETRY_BASE_S",
    "RETRY_CAP_S",
    "RedisClusterConfig",
    "RedisConfig",
    "RedisTier",
    "RedisTierConfig",
    "sentinel_key",
    "stat_hash",
    "value_hash",
]

log = logging.getLogger(__name__)


class RedisTier(NodeRouting, Tier):
    """``redis_cluster`` / ``redis``: embeddings in a Redis Cluster or one Redis server.

    Node routing, retries and breakers are :class:`~.redis_routing.NodeRouting`'s; the
    table layout and Lua scripts :mod:`.redis_layout`'s."""

    configs = (RedisClusterConfig, RedisConfig)
    shared = True  # every replica reads the same servers
    read_only = False

    def __init__(self, config: RedisClusterConfig | RedisConfig) -> None:
        self.kind = config.type.value
        super().__init__()
        redis = require_extra("redis", "redis", f"The {self.kind} tier")
        self._redis = redis
        self.config = config
        self.num_partitions = int(config.num_partitions)
        self.max_batch_size = int(config.max_set_batch_size or config.max_batch_size)  # writes
        self.max_get_batch_size = int(config.max_get_batch_size or config.max_batch_size)
        self.policy = make_policy(config.overflow_policy)
        self.overflow_margin = int(config.overflow_margin)
        self.resolution_target = resolution_size(
            self.overflow_margin, config.overflow_resolution_target
        )
        self.refresh_after_fetch = bool(config.refresh_time_after_fetch)
        self.max_retries = int(config.max_retries)
        # Replicas that lost the same node retry it at spread times.
        self._retry_backoff = EqualJitterBackoff(cap=RETRY_CAP_S, base=RETRY_BASE_S)
        self.breakers = BreakerSet(
            int(config.failure_threshold),
            ExponentialBackoff(
                cap=config.max_failure_backoff_ms / 1000.0, base=config.failure_backoff_ms / 1000.0
            ),
        )
        self._dims: dict[str, int] = {}
        self._ttl: dict[str, float] = {}  # tables with a time-to-live: seconds
        self._rng = np.random.default_rng()
        self._lock = threading.Lock()
        self._network_errors = network_errors(redis)
        self._cluster = config.type.value == "redis_cluster"
        self._topology: TopologyRefresher | None = None
        try:
            self._client = open_client(redis, config)
        except self._network_errors as exc:
            raise BackendUnavailableError(
                f"cannot reach the {self.kind} at {config.address}: {exc}"
            ) from exc
        if self._cluster:
            self._topology = TopologyRefresher(
                self._refresh_topology, config.topology_refresh_ms / 1000.0, self.kind
            )

    # --- tables ----------------------------------------------------------------------------

    def create_table(self, tag: str, dim: int) -> None:
        with self._lock:
            old = self._dims.get(tag)
            if old is not None and old != dim:
                raise InvalidInputError(f"table {tag} exists with dim {old}, not {dim}")
            self._dims[tag] = int(dim)

    def set_ttl(self, tag: str, seconds: float | None) -> None:
        """:meth:`Tier.set_ttl`: the table's statistics hashes keep each row's last write or
        lookup time (lookups always refresh it), and :meth:`expire` sweeps them.  Redis 7.0
        expires whole keys only (a partition hash holds many rows; per-field HPEXPIRE came
        with 7.4), so the sweep is ours."""
        if seconds is None:
            return
        check_ttl_policy(self.policy, self.kind)
        self._ttl[tag] = float(seconds)

    def expire(self, tag: str, keep=None) -> np.ndarray:
        """Remove the rows of ``tag`` not written or looked up for its TTL: each partition's
        statistics hash is scanned (HSCAN, no blocking HGETALL) and the old rows deleted by
        a script that checks their time again."""
        seconds = self._ttl.get(tag)
        if seconds is None:
            return np.empty(0, dtype=np.int64)
        cutoff = time.time_ns() // 1000 - int(seconds * 1e6)
        gone: list[bytes] = []
        for name, (conn, parts) in self._routes(tag, range(self.num_partitions)).items():
            if not self._allow(name):
                continue
            try:
                for p in parts:
                    gone += self._expire_partition(conn, tag, p, cutoff)
            except self._network_errors as exc:
                self._node_failed(name, exc, "expiry sweep")
                continue
            self.breakers[name].succeeded()
        self.stats.expired += len(gone)
        return np.frombuffer(b"".join(gone), dtype="<i8").astype(np.int64)

    def _expire_partition(self, conn, tag: str, p: int, cutoff: int) -> list[bytes]:
        vname, tname = value_hash(tag, p), stat_hash(tag, p)
        old = [f for f, t in conn.hscan_iter(tname, count=self.max_get_batch_size)
               if int(t) < cutoff]  # fmt: skip
        gone: list[bytes] = []
        for c0 in range(0, len(old), self.max_batch_size):
            gone += conn.eval(_EXPIRE_SCRIPT, 2, vname, tname, cutoff,
                              *old[c0 : c0 + self.max_batch_size])  # fmt: skip
        return gone

    def dim(self, tag: str) -> int | None:
        return self._dims.get(tag)

    def tables(self) -> list[str]:
        return list(self._dims)

    def drop_table(self, tag: str) -> None:
        names = []
        for p in range(self.num_partitions):
            names += [value_hash(tag, p), stat_hash(tag, p)]
        for name, (conn, parts) in self._routes(tag, range(self.num_partitions)).items():

            def queue(pipe, parts=parts):
                for p in parts:  # UNLINK frees big hashes in the background
                    pipe.unlink(value_hash(tag, p), stat_hash(tag, p), sentinel_key(tag, p))

            try:
                self._run(conn, queue)
            except self._network_errors as exc:
                self._node_failed(name, exc, "drop")
                raise BackendUnavailableError(f"{self.kind}: cannot drop {tag}: {exc}") from exc
            self.breakers[name].succeeded()
        with self._lock:
            self._dims.pop(tag, None)
            self._ttl.pop(tag, None)

    # --- data ------------------------------------------------------------------------------

    def contains(self, tag: str, keys) -> np.ndarray:
        return self.lookup(tag, keys, refresh=False)[1]

    def lookup(self, tag: str, keys, *, refresh: bool = True) -> tuple[np.ndarray, np.ndarray]:
        dim = self._require_dim(tag)
        keys = as_keys(keys)
        n = keys.size
        with self.stats.timed("lookup"):
            order, bounds = group_by_partition(keys, self.num_partitions)
            fields = key_fields(keys[order])
            values: list = [None] * n
            parts = [p for p in range(self.num_partitions) if bounds[p + 1] > bounds[p]]
            for name, (conn, node_parts) in self._routes(tag, parts).items():
                if not self._allow(name):
                    self.stats.skipped += sum(int(bounds[p + 1] - bounds[p]) for p in node_parts)
                    continue
                spans = [
                    (value_hash(tag, p), c0, c1)
                    for p in node_parts
                    for c0, c1 in self._spans(bounds[p], bounds[p + 1], self.max_get_batch_size)
                ]

                def queue(pipe, spans=spans):
                    for vname, c0, c1 in spans:
                        pipe.execute_command("HMGET", vname, *fields[c0:c1])

                try:
                    results = self._run(conn, queue)
                except self._network_errors as exc:
                    self._node_failed(name, exc, "lookup")
                    continue
                self.breakers[name].succeeded()
                for (_, c0, c1), res in zip(spans, results):
                    values[c0:c1] = res
            ok, found_emb = decode_values(values, dim, f"{self.kind} table {tag}")
            emb = np.zeros((n, dim), dtype=np.float32)
            found = np.zeros(n, dtype=bool)
            pos = order[ok]
            emb[pos] = found_emb
            found[pos] = True
            hits = found_emb.shape[0]
            self.stats.hits += hits
            self.stats.misses += n - hits
            refresh = refresh and (
                (self.refresh_after_fetch and self._statistic(tag)) or tag in self._ttl
            )
            if refresh and hits:
                self._touch(tag, keys[pos])
            return emb, found

    def _touch(self, tag: str, keys: np.ndarray) -> None:
        """Record an access to ``keys`` in the statistics hashes (best effort)."""
        order, bounds = group_by_partition(keys, self.num_partitions)
        fields = key_fields(keys[order])
        parts = [p for p in range(self.num_partitions) if bounds[p + 1] > bounds[p]]
        now = time.time_ns() // 1000
        for name, (conn, node_parts) in self._routes(tag, parts).items():
            if not self._allow(name):
                continue

            def queue(pipe, node_parts=node_parts):
                for p in node_parts:
                    for c0, c1 in self._spans(bounds[p], bounds[p + 1]):
                        self._queue_stat(pipe, tag, p, fields[c0:c1], now)

            try:
                self._run(conn, queue)
            except self._network_errors as exc:
                self._node_failed(name, exc, "access-time refresh")
            else:
                self.breakers[name].succeeded()

    def _statistic(self, tag: str) -> str | None:
        """What table ``tag``'s ``t`` hashes keep: access times with a TTL, else the overflow
        policy's statistic when an ``overflow_margin`` makes it evict, else nothing (as
        HugeCTR's ``evict_random``; HugeCTR's ``evict_oldest`` writes times without a margin
        too, which nothing reads)."""
        if tag in self._ttl:
            return "recency"
        return self.policy.track if self.overflow_margin < UNBOUNDED else None

    def _queue_stat(self, pipe, tag: str, p: int, fields: list, now: int) -> int:
        """Queue the statistics update of ``fields``; returns how many commands it queued."""
        statistic = self._statistic(tag)
        if statistic == "recency":
            pipe.execute_command("HSET", stat_hash(tag, p), *_interleave(fields, [now] * len(fields)))
            return 1
        if statistic == "frequency":
            pipe.eval(_COUNT_SCRIPT, 1, stat_hash(tag, p), *fields)
            return 1
        return 0

    def insert(self, tag: str, keys, embeddings) -> None:
        dim = self._require_dim(tag)
        keys, embeddings = self._check_insert(keys, embeddings, dim, tag)
        if keys.size == 0:
            return
        with self.stats.timed("insert"):
            order, bounds = group_by_partition(keys, self.num_partitions)
            fields = key_fields(keys[order])
            vals = vector_values(embeddings[order])
            parts = [p for p in range(self.num_partitions) if bounds[p + 1] > bounds[p]]
            now = time.time_ns() // 1000
            for name, (conn, node_parts) in self._routes(tag, parts).items():
                self._admit(name, "insert")
                hlen_at = []  # (partition, position of its HLEN reply)

                def queue(pipe, node_parts=node_parts, hlen_at=hlen_at):
                    hlen_at.clear()
                    queued = 0
                    for p in node_parts:
                        vname = value_hash(tag, p)
                        for c0, c1 in self._spans(bounds[p], bounds[p + 1]):
                            pipe.execute_command(
                                "HSET", vname, *_interleave(fields[c0:c1], vals[c0:c1])
                            )
                            queued += 1 + self._queue_stat(pipe, tag, p, fields[c0:c1], now)
                        pipe.hlen(vname)
                        hlen_at.append((p, queued))
                        queued += 1

                try:
                    results = self._run(conn, queue)
                except self._network_errors as exc:
                    self._node_failed(name, exc, "insert")
                    raise BackendUnavailableError(
                        f"{self.kind} node {name} is unreachable: {exc}"
                    ) from exc
                self.breakers[name].succeeded()
                for p, idx in hlen_at:
                    if int(results[idx]) > self.overflow_margin:
                        self._resolve_overflow(conn, tag, p, int(results[idx]))
            self.stats.inserts += keys.size

    def load_table(self, tag: str, keys, embeddings, chunk: int = 1 << 18) -> None:
        """Bulk insert, then mark every partition as filled (see :mod:`tierserve.ps.refill`)."""
        super().load_table(tag, keys, embeddings, chunk)
        self.mark_partitions(tag, range(self.num_partitions))

    def _resolve_overflow(self, conn, tag: str, p: int, size: int) -> None:
        excess = size - self.resolution_target
        vname, tname = value_hash(tag, p), stat_hash(tag, p)
        if self.policy.track is None:
            victims = conn.hrandfield(vname, excess) or []
        else:
            stats = conn.hgetall(tname)
            if len(stats) < size:  # rows written while no statistic was kept: the oldest
                stats = {**dict.fromkeys(conn.hkeys(vname), b"0"), **stats}
            names = list(stats)
            counts = np.fromiter(map(int, stats.values()), dtype=np.int64, count=len(names))
            chosen = self.policy.select(counts, len(names), min(excess, len(names)), self._rng)
            victims = [names[i] for i in chosen.tolist()]
        removed = 0
        for c0 in range(0, len(victims), self.max_batch_size):
            chunk = victims[c0 : c0 + self.max_batch_size]
            pipe = conn.pipeline(transaction=False)
            pipe.hdel(vname, *chunk)
            pipe.hdel(tname, *chunk)
            removed += int(pipe.execute()[0])
        self.stats.evictions += removed

    def evict(self, tag: str, keys) -> int:
        keys = as_keys(keys)
        if keys.size == 0:
            return 0
        order, bounds = group_by_partition(keys, self.num_partitions)
        fields = key_fields(keys[order])
        parts = [p for p in range(self.num_partitions) if bounds[p + 1] > bounds[p]]
        removed = 0
        for name, (conn, node_parts) in self._routes(tag, parts).items():
            self._admit(name, "evict")

            def queue(pipe, node_parts=node_parts):
                for p in node_parts:
                    for c0, c1 in self._spans(bounds[p], bounds[p + 1]):
                        pipe.hdel(value_hash(tag, p), *fields[c0:c1])
                        pipe.hdel(stat_hash(tag, p), *fields[c0:c1])

            try:
                results = self._run(conn, queue)
            except self._network_errors as exc:
                self._node_failed(name, exc, "evict")
                raise BackendUnavailableError(f"{self.kind} node {name}: {exc}") from exc
            self.breakers[name].succeeded()
            removed += sum(int(r) for r in results[::2])
        return removed

    def partition_sizes(self, tag: str) -> list[int]:
        """How many keys each partition of ``tag`` holds."""
        sizes = [0] * self.num_partitions
        for name, (conn, parts) in self._routes(tag, range(self.num_partitions)).items():

            def queue(pipe, parts=parts):
                for p in parts:
                    pipe.hlen(value_hash(tag, p))

            try:
                for p, n in zip(parts, self._run(conn, queue)):
                    sizes[p] = int(n)
            except self._network_errors as exc:
                self._node_failed(name, exc, "size")
                raise BackendUnavailableError(f"{self.kind} node {name}: {exc}") from exc
        return sizes

    def unmarked_partitions(self, tag: str) -> list[int]:
        """The partitions of ``tag`` whose fill mark is missing (:meth:`mark_partitions`).

        A node that restarted without persistence lost the marks of its partitions with
        their data.  Raises :class:`BackendUnavailableError` when a node cannot be reached.
        """
        missing = []
        for name, (conn, parts) in self._routes(tag, range(self.num_partitions)).items():
            self._admit(name, "fill check")

            def queue(pipe, parts=parts):
                for p in parts:
                    pipe.exists(sentinel_key(tag, p))

            try:
                replies = self._run(conn, queue)
            except self._network_errors as exc:
                self._node_failed(name, exc, "fill check")
                raise BackendUnavailableError(f"{self.kind} node {name}: {exc}") from exc
            self.breakers[name].succeeded()
            missing += [p for p, there in zip(parts, replies) if not int(there)]
        return sorted(missing)

    def mark_partitions(self, tag: str, partitions) -> None:
        """Record that ``partitions`` of ``tag`` hold what they should (a key on their node)."""
        for name, (conn, parts) in self._routes(tag, partitions).items():

            def queue(pipe, parts=parts):
                for p in parts:
                    pipe.set(sentinel_key(tag, p), b"1")

            try:
                self._run(conn, queue)
            except self._network_errors as exc:
                self._node_failed(name, exc, "fill mark")
                raise BackendUnavailableError(f"{self.kind} node {name}: {exc}") from exc

    def size(self, tag: str) -> int:
        return sum(self.partition_sizes(tag))

    def list_keys(self, tag: str) -> np.ndarray:
        chunks = []
        for name, (conn, parts) in self._routes(tag, range(self.num_partitions)).items():
            try:
                for p in parts:
                    chunks.extend(conn.hkeys(value_hash(tag, p)))
            except self._network_errors as exc:
                self._node_failed(name, exc, "list keys")
                raise BackendUnavailableError(f"{self.kind} node {name}: {exc}") from exc
        return np.frombuffer(b"".join(chunks), dtype="<i8").astype(np.int64)

    def get_meta(self, name: str) -> str | None:
        try:
            raw = self._client.get(f"hps_meta{{{name}}}")
        except self._network_errors as exc:
            raise BackendUnavailableError(f"{self.kind}: cannot read {name}: {exc}") from exc
        return None if raw is None else raw.decode()

    def set_meta(self, name: str, value: str) -> None:
        try:
            self._client.set(f"hps_meta{{{name}}}", value)
        except self._network_errors as exc:
            raise BackendUnavailableError(f"{self.kind}: cannot write {name}: {exc}") from exc

    def close(self) -> None:
        if self._topology is not None:
            self._topology.close()
        with contextlib.suppress(Exception):  # closing a dead connection may fail
            self._client.close()
