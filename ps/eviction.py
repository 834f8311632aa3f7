"""Overflow policies: which entries a full partition gives up (HugeCTR's overflow handling).

When a partition holds more than ``overflow_margin`` entries, the tier evicts until it holds
at most ``overflow_margin * overflow_resolution_target``.  A policy only *chooses*: given the
per-entry statistic the tier keeps (last-access tick or access count; none for random), it
returns the positions of the entries to evict.  Tiers call :func:`make_policy` once.
"""

from __future__ import annotations

import math

import numpy as np

from tierserve.core.errors import ConfigError

from .config_base import DatabaseOverflowPolicy_t


class EvictionPolicy:
    """Chooses victims among ``n`` entries whose statistics are ``stats`` (or ``None``)."""

    #: The statistic the tier must keep for this policy: ``"recency"``, ``"frequency"`` or None.
    track: str | None = None

    def select(
        self, stats: np.ndarray | None, n: int, count: int, rng: np.random.Generator
    ) -> np.ndarray:
        raise NotImplementedError


class _Smallest(EvictionPolicy):
    def select(self, stats, n, count, rng):
        if count >= n:
            return np.arange(n)
        return np.argpartition(stats, count - 1)[:count]


class EvictOldest(_Smallest):
    """``evict_oldest``: least recently used first (smallest last-access tick)."""

    track = "recency"


class EvictLeastUsed(_Smallest):
    """``evict_least_used``: least frequently used first (smallest access count)."""

    track = "frequency"


class EvictRandom(EvictionPolicy):
    """``evict_random``: uniformly random victims; keeps no statistic."""

    track = None

    def select(self, stats, n, count, rng):
        if count >= n:
            return np.arange(n)
        return rng.choice(n, size=count, replace=False)


_POLICIES = {
    DatabaseOverflowPolicy_t.evict_oldest: EvictOldest,
    DatabaseOverflowPolicy_t.evict_least_used: EvictLeastUsed,
    DatabaseOverflowPolicy_t.evict_random: EvictRandom,
}


def make_policy(policy: DatabaseOverflowPolicy_t | str) -> EvictionPolicy:
    """The strategy object for a configured ``overflow_policy``."""
    return _POLICIES[DatabaseOverflowPolicy_t(policy)]()


def resolution_size(overflow_margin: int, target: float) -> int:
    """How many entries a partition keeps after resolving an overflow."""
    return int(math.floor(overflow_margin * target))


def check_ttl_policy(policy: EvictionPolicy, kind: str) -> None:
    """Refuse a table TTL on a tier whose per-row statistic is not an access time."""
    if policy.track == "frequency":
        raise ConfigError(
            f"ttl_seconds needs the last access time of each row, but the {kind} tier's "
            "overflow_policy evict_least_used keeps access counts instead: use evict_oldest "
            "or evict_random with a TTL"
        )
