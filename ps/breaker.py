"""Circuit breakers: a backend that keeps failing is skipped for a growing back-off.

In the manner of redis-py's ``retry.py`` / ``backoff.py``, a strategy object that a network
tier consults around each call to one node:

- *closed*: every call goes through; ``threshold`` consecutive failures open the circuit.
- *open*: calls are refused (:meth:`CircuitBreaker.allow` is False) until the back-off of
  this opening ends: ``backoff.compute(n)`` seconds for the ``n``-th opening in a row, so a
  backend that stays down is tried less and less often, up to the back-off's cap.
- *half open*: the first caller after the back-off is let through as the probe; every other
  call is still refused until the probe reports.  Success closes the circuit (and forgets the
  openings); failure opens it again with the next, longer back-off.  A probe that never
  reports (its caller died) is replaced by a new one once another back-off has passed.

So a frozen backend costs one call per back-off period its full timeout, instead of every
request waiting for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .retry import Backoff, ExponentialBackoff

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"


class CircuitBreaker:
    """The state of one backend (node); see the module docstring."""

    def __init__(
        self,
        threshold: int = 3,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if threshold < 1:
            raise ValueError(f"threshold must be at least 1, got {threshold}")
        self.threshold = int(threshold)
        self.backoff = backoff or ExponentialBackoff(cap=30.0, base=1.0)
        self._clock = clock
        self._lock = threading.Lock()
        self._failures = 0  # consecutive failures while closed
        self._openings = 0  # openings in a row since the last success
        self._state = CLOSED
        self._until = 0.0  # open: when the probe may go; half open: when the probe is lost

    @property
    def state(self) -> str:
        """``closed``, ``open`` or ``half_open``."""
        return self._state

    def retry_in(self) -> float:
        """Seconds until a probe is let through (0 when closed or the back-off has ended)."""
        if self._state == CLOSED:
            return 0.0
        return max(0.0, self._until - self._clock())

    def allow(self) -> bool:
        """Whether the caller may call the backend now (when True, report the outcome)."""
        if self._state == CLOSED:  # the common case takes no lock
            return True
        with self._lock:
            if self._state == CLOSED:
                return True
            now = self._clock()
            if now < self._until:
                return False
            # The back-off ended (open) or the probe never reported (half open): probe now.
            self._state = HALF_OPEN
            self._until = now + self.backoff.compute(max(self._openings, 1))
            return True

    def succeeded(self) -> None:
        """The call reached the backend: close the circuit."""
        if self._state == CLOSED and self._failures == 0:
            return
        with self._lock:
            self._state = CLOSED
            self._failures = 0
            self._openings = 0

    def failed(self) -> None:
        """The call could not reach the backend (connection refused, timed out)."""
        with self._lock:
            if self._state == CLOSED:
                self._failures += 1
                if self._failures < self.threshold:
                    return
            self._openings += 1
            self._failures = 0
            self._state = OPEN
            self._until = self._clock() + self.backoff.compute(self._openings)


class BreakerSet:
    """One :class:`CircuitBreaker` per backend name, made on first use with the same settings."""

    def __init__(
        self,
        threshold: int = 3,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = threshold
        self.backoff = backoff or ExponentialBackoff(cap=30.0, base=1.0)
        self._clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> CircuitBreaker:
        breaker = self._breakers.get(name)
        if breaker is None:
            with self._lock:
                breaker = self._breakers.setdefault(
                    name, CircuitBreaker(self.threshold, self.backoff, self._clock)
                )
        return breaker

    def states(self) -> dict[str, str]:
        """``{backend name: state}`` of every backend seen so far."""
        return {name: b.state for name, b in list(self._breakers.items())}
