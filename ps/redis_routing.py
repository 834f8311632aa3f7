"""Calls to the nodes of a Redis tier: which node serves a table partition (the cluster's
slot map, re-read in the background after failures and redirects), one pipeline per node
repeated on network failures (``max_retries``, jittered back-off), Redis' out-of-memory
refusal as :class:`~tierserve.core.errors.StorageFullError`, and each node's circuit breaker
(``failure_threshold``)."""

from __future__ import annotations

import logging
import time

from tierserve.core.errors import BackendSkippedError, BackendUnavailableError, StorageFullError

from .breaker import BreakerSet
from .redis_layout import value_hash
from .retry import EqualJitterBackoff
from .stats import TierStats
from .topology import TopologyRefresher

log = logging.getLogger("tierserve.ps.redis_tier")

#: The wait before the n-th repeat of a call that failed on the network (``max_retries``):
#: 10, 20, 40 ... ms (equal jitter: between half and all of it), at most 1 s.
RETRY_BASE_S, RETRY_CAP_S = 0.01, 1.0


class NodeRouting:
    """Routing, retries and breakers of :class:`~tierserve.ps.redis_tier.RedisTier` (which
    sets the state below)."""

    kind: str
    stats: TierStats
    max_batch_size: int
    max_retries: int
    breakers: BreakerSet
    _redis: object
    _client: object
    _cluster: bool
    _topology: TopologyRefresher | None
    _network_errors: tuple[type[BaseException], ...]
    _retry_backoff: EqualJitterBackoff

    def _routes(self, tag: str, partitions) -> dict[str, tuple[object, list[int]]]:
        """``{node name: (client of that node, [partitions it serves])}``."""
        routes: dict[str, tuple[object, list[int]]] = {}
        for p in partitions:
            if self._cluster:
                try:
                    node = self._client.get_node_from_key(value_hash(tag, p))
                except self._redis.exceptions.SlotNotCoveredError as exc:
                    self._topology.request()
                    raise BackendUnavailableError(
                        f"{self.kind}: no node serves partition {p} of {tag}: {exc}"
                    ) from exc
                name = node.name
                if name not in routes:
                    routes[name] = (self._client.get_redis_connection(node), [])
            else:
                name = "standalone"
                if name not in routes:
                    routes[name] = (self._client, [])
            routes[name][1].append(p)
        return routes

    def _run(self, conn, queue) -> list:
        """Send the commands ``queue(pipeline)`` adds to one node; returns the replies.

        A network failure is retried ``max_retries`` times (a fresh pipeline each time), then
        raised to the caller.
        """
        attempt = 0
        while True:
            pipe = conn.pipeline(transaction=False)
            queue(pipe)
            try:
                return pipe.execute()
            except self._network_errors:
                if attempt >= self.max_retries:
                    raise
                attempt += 1
                time.sleep(self._retry_backoff.compute(attempt))
            except self._redis.exceptions.OutOfMemoryError as exc:
                # redis-py quotes the refused command, key and vector bytes included: only
                # the server's reply is kept.
                reply = str(exc).rpartition("caused error: ")[2].rstrip(". ")
                raise StorageFullError(
                    f"{self.kind}: the Redis server is out of memory ({reply}; its "
                    "maxmemory-policy evicts nothing); retried once memory is freed"
                ) from None

    def _allow(self, name: str) -> bool:
        """Whether node ``name`` may be called now; a skipped cluster node may have been
        replaced (failover): the slot map is read again (in the background)."""
        if self.breakers[name].allow():
            return True
        if self._topology is not None:
            self._topology.request()
        return False

    def _admit(self, name: str, what: str) -> None:
        """Raise at once when node ``name`` is being skipped, rather than wait on it."""
        breaker = self.breakers[name]
        if not self._allow(name):
            raise BackendSkippedError(
                f"{self.kind} node {name} is skipped after repeated failures ({what} not "
                f"sent); it is tried again in {breaker.retry_in():.1f} s"
            )

    def _node_failed(self, name: str, exc: Exception, what: str) -> None:
        self.stats.errors += 1
        self.breakers[name].failed()
        if self._topology is not None:  # dead, or no longer the slots' master (MOVED)
            self._topology.request()
        log.warning("%s tier: %s on node %s failed: %s", self.kind, what, name, exc)

    def masters(self) -> list[str]:
        """The cluster nodes that serve slots, as this client's slot map says now."""
        if not self._cluster:
            return ["standalone"]
        return sorted({n.name for n in self._client.get_primaries()})

    def _refresh_topology(self) -> None:
        """Read the slot map again (from any node that answers, the failed one last);
        logs when the masters changed."""
        before = self.masters()
        self._client.nodes_manager.initialize()
        after = self.masters()
        if after != before:
            log.warning("%s tier: the cluster's masters are now %s (were %s); calls follow",
                        self.kind, ", ".join(after), ", ".join(before))  # fmt: skip

    def _spans(self, b0: int, b1: int, mb: int | None = None):
        mb = mb or self.max_batch_size
        return [(c0, min(b1, c0 + mb)) for c0 in range(b0, b1, mb)]
