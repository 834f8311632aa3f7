"""Backoff strategies: how long to wait after the ``n``-th failure in a row.

In the manner of redis-py's ``backoff.py``: small strategy objects with ``compute(failures)``
and ``reset()``, built as ``ExponentialBackoff(cap, base)`` (redis-py's argument order).  One
difference: the ``n``-th failure's ceiling is ``base * 2 ** (n - 1)``, so the first failure
waits ``base`` (redis-py's waits ``2 * base``); ``compute(0)`` is 0.

Jitter spreads retries that start together (every replica losing the same Redis node, every
worker of a host dying at once) so they do not arrive together again:

- :class:`FullJitterBackoff`: uniform in ``[0, ceiling]``;
- :class:`EqualJitterBackoff`: uniform in ``[ceiling / 2, ceiling]``: never less than half.

Users: the Redis tier's retries of one call and the circuit breaker's skip time
(:mod:`tierserve.ps.breaker`), the restarts of a failing Kafka consumer loop, the model
repository's retries of a version whose backend failed, and the restarts of a worker that
exits soon after it started.
"""

from __future__ import annotations

import abc
import random


class Backoff(abc.ABC):
    """How long to wait before the next try."""

    def reset(self) -> None:  # noqa: B027 - stateless strategies have nothing to reset
        """Forget state kept between calls (none here; redis-py's interface)."""

    @abc.abstractmethod
    def compute(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th failure in a row (0 for none)."""


class ConstantBackoff(Backoff):
    """Always ``backoff`` seconds after a failure."""

    def __init__(self, backoff: float) -> None:
        if backoff < 0:
            raise ValueError(f"backoff must not be negative, got {backoff}")
        self.backoff = float(backoff)

    def compute(self, failures: int) -> float:
        return self.backoff if failures > 0 else 0.0


class NoBackoff(ConstantBackoff):
    """Always try again at once."""

    def __init__(self) -> None:
        super().__init__(0.0)


class ExponentialBackoff(Backoff):
    """``min(cap, base * 2 ** (failures - 1))`` seconds: ``base``, ``2 * base``, ... ``cap``."""

    def __init__(self, cap: float, base: float) -> None:
        if base < 0 or cap < 0:
            raise ValueError(f"cap and base must not be negative, got cap={cap}, base={base}")
        self.cap = float(cap)
        self.base = float(base)

    def ceiling(self, failures: int) -> float:
        """The un-jittered wait after the ``failures``-th failure."""
        if failures <= 0:
            return 0.0
        return min(self.cap, self.base * 2.0 ** min(failures - 1, 60))

    def compute(self, failures: int) -> float:
        return self.ceiling(failures)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(cap={self.cap}, base={self.base})"


class _Jittered(ExponentialBackoff):
    def __init__(self, cap: float, base: float, rng: random.Random | None = None) -> None:
        super().__init__(cap, base)
        # random.Random's methods are safe to call from several threads.
        self._rng = rng or random.Random()


class FullJitterBackoff(_Jittered):
    """Uniform in ``[0, ceiling]`` (``rng``: a ``random.Random`` to draw from)."""

    def compute(self, failures: int) -> float:
        return self._rng.uniform(0.0, self.ceiling(failures))


class EqualJitterBackoff(_Jittered):
    """Uniform in ``[ceiling / 2, ceiling]`` (``rng``: a ``random.Random`` to draw from)."""

    def compute(self, failures: int) -> float:
        half = self.ceiling(failures) / 2
        return half + self._rng.uniform(0.0, half)
