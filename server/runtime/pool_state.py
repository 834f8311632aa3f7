"""What the worker processes of one server share (:mod:`tierserve.server.workers`): a listening
socket on a port they all bind (``SO_REUSEPORT``), :class:`PoolState` (readiness, liveness, the
versions staged) and the data plane of a pool's worker (:class:`PooledDataPlane`), with which
the app (:mod:`tierserve.server.app`) answers readiness for the pool and commits versions
together.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import time
from typing import Any

from tierserve.core.errors import ConfigError

from .dataplane import DataPlane

log = logging.getLogger("tierserve.server.workers")


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` that other processes may bind too (SO_REUSEPORT)."""
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    return sock


#: Versions each worker remembers having staged (for workers that start later).
STAGED_RING = 16
#: How long a staged version waits for the other workers before it commits anyway.
COMMIT_BARRIER_S = 60.0


def version_token(model: str, version: str) -> int:
    """A nonzero 63-bit token naming a model version in the pool's shared arrays."""
    digest = hashlib.blake2b(f"{model}\0{version}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1 or 1


class PoolState:
    """What a worker shares with its pool: readiness, liveness and the versions staged.

    ``ready``: one byte per worker, 1 while it reports ready; ``alive``: one byte per worker,
    set by the parent while its process runs; ``staged``: per worker, a ring of
    :data:`STAGED_RING` tokens of the versions it staged (:func:`version_token`).
    """

    def __init__(self, index: int, ready, alive=None, staged=None) -> None:
        self.index = index
        self.ready = ready
        self.alive = alive
        self.staged = staged
        self._next = 0

    def report(self, ready: bool) -> None:
        self.ready[self.index] = 1 if ready else 0

    def all_ready(self) -> bool:
        return all(self.ready)

    def _has_staged(self, worker: int, token: int) -> bool:
        ring = self.staged[worker * STAGED_RING : (worker + 1) * STAGED_RING]
        return token in ring

    def wait_for_peers(self, model: str, version: str, timeout: float = COMMIT_BARRIER_S) -> bool:
        """Record that this worker staged ``model`` ``version`` and wait until every other
        running worker has staged it too, so the pool commits it together; False (after a
        warning) when ``timeout`` seconds pass first."""
        if self.staged is None:
            return True
        token = version_token(model, version)
        self.staged[self.index * STAGED_RING + self._next] = token
        self._next = (self._next + 1) % STAGED_RING
        deadline = time.monotonic() + timeout
        while True:
            waiting = [
                j for j in range(len(self.ready))
                if j != self.index and self.alive[j] and not self._has_staged(j, token)
            ]  # fmt: skip
            if not waiting:
                return True
            if time.monotonic() >= deadline:
                log.warning(
                    "model %s version %s: workers %s have not staged it after %.0f s; "
                    "committing it here anyway", model, version, waiting, timeout,
                )  # fmt: skip
                return False
            time.sleep(0.02)


class PooledDataPlane(DataPlane):
    """The data plane of one worker of a pool (:mod:`tierserve.server.workers`): readiness is the
    pool's (this worker reports its own and answers ready only while every worker is), and
    repository load and unload requests are refused (they would reach this one worker only)."""

    def __init__(self, *args: Any, pool: PoolState, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pool = pool

    def own_ready(self) -> bool:
        """This worker's own readiness (what it reports to the pool)."""
        return super().ready()

    def ready(self) -> bool:
        return self.own_ready() and self.pool.all_ready()

    def not_ready_reason(self) -> str:
        if not self.own_ready():
            return super().not_ready_reason()
        return "another worker process is not ready"

    async def load(self, name: str) -> None:
        raise self._one_worker_only()

    async def unload(self, name: str) -> None:
        raise self._one_worker_only()

    def _one_worker_only(self) -> ConfigError:
        return ConfigError(
            f"repository load and unload are not available with --workers "
            f"{len(self.pool.ready)}: the request would reach one worker process only; "
            "add or remove version folders (the workers pick them up together) or serve "
            "with --workers 1"
        )
