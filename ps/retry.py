"""Backoff strategies for unreachable backend nodes (in the manner of redis-py's backoff).

``compute(n)`` is how long to wait after the ``n``-th failure in a row: between retries of
one call, in :mod:`tierserve.ps.breaker` how long a failing node is skipped, and in the
server's worker pool how long a worker that died waits to be started again.
"""

from __future__ import annotations

import random


class ExponentialBackoff:
    """``min(cap, base * 2 ** (failures - 1))`` seconds, less a random share of up to
    ``jitter`` of it (0: none; 0.5: between half and all of it), so that processes that
    failed together do not retry together."""

    def __init__(self, base: float = 0.05, cap: float = 1.0, jitter: float = 0.0) -> None:
        if not 0.0 <= jitter <= 1.0:
            raise ValueError(f"jitter must be within [0, 1], got {jitter}")
        self.base = base
        self.cap = cap
        self.jitter = jitter

    def compute(self, failures: int) -> float:
        if failures <= 0:
            return 0.0
        delay = min(self.cap, self.base * 2 ** min(failures - 1, 30))
        if self.jitter:
            delay *= 1.0 - self.jitter * random.random()
        return delay


class NoBackoff(ExponentialBackoff):
    """Always try again at once."""

    def __init__(self) -> None:
        super().__init__(0.0, 0.0)
