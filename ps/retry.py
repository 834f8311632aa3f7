"""Backoff strategies for unreachable backend nodes (in the manner of redis-py's backoff).

``compute(n)`` is how long to wait after the ``n``-th failure in a row: between retries of
one call, and in :mod:`tierserve.ps.breaker` how long a failing node is skipped.
"""

from __future__ import annotations


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
