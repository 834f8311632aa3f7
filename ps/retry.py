"""Backoff strategies for unreachable backend nodes (in the manner of redis-py's backoff).

A network tier asks :class:`NodeHealth` whether a node may be tried now.  After a failure
the node is skipped for ``backoff.compute(failures)`` seconds, so a dead node costs one
failed connection attempt per backoff period rather than one per request; the first
success resets it.
"""

from __future__ import annotations

import threading
import time


class ExponentialBackoff:
    """``min(cap, base * 2 ** (failures - 1))`` seconds."""

    def __init__(self, base: float = 0.05, cap: float = 1.0) -> None:
        self.base = base
        self.cap = cap

    def compute(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        return min(self.cap, self.base * 2 ** min(failures - 1, 30))


class NoBackoff(ExponentialBackoff):
    """Always try again at once."""

    def __init__(self) -> None:
        super().__init__(0.0, 0.0)


class NodeHealth:
    """Per-node failure counts and the time before each node is tried again."""

    def __init__(self, backoff: ExponentialBackoff | None = None) -> None:
        self.backoff = backoff or ExponentialBackoff()
        self._failures: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        self._lock = threading.Lock()

    def available(self, node: str) -> bool:
        """Whether ``node`` may be tried now."""
        return time.monotonic() >= self._retry_at.get(node, 0.0)

    def failed(self, node: str) -> None:
        with self._lock:
            n = self._failures.get(node, 0) + 1
            self._failures[node] = n
            self._retry_at[node] = time.monotonic() + self.backoff.compute(n)

    def succeeded(self, node: str) -> None:
        if node in self._failures:
            with self._lock:
                self._failures.pop(node, None)
                self._retry_at.pop(node, None)
