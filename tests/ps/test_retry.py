"""The backoff strategies of ``tierserve.ps.retry``: the sequence, the cap, and the jitter's
bounds and spread."""

from __future__ import annotations

import random
import statistics

import pytest

from tierserve.ps.retry import (
    ConstantBackoff,
    EqualJitterBackoff,
    ExponentialBackoff,
    FullJitterBackoff,
    NoBackoff,
)


def test_exponential_doubles_from_base_to_cap_in_redis_py_argument_order():
    backoff = ExponentialBackoff(0.5, 0.1)  # redis-py's order: cap, then base
    assert (backoff.cap, backoff.base) == (0.5, 0.1)
    assert [backoff.compute(n) for n in range(6)] == [0.0, 0.1, 0.2, 0.4, 0.5, 0.5]
    assert backoff.compute(10_000) == 0.5  # no overflow for long outages
    assert NoBackoff().compute(3) == 0.0
    assert [ConstantBackoff(0.25).compute(n) for n in (0, 1, 7)] == [0.0, 0.25, 0.25]
    with pytest.raises(ValueError):
        ExponentialBackoff(1.0, -0.1)


@pytest.mark.parametrize("kind,low", [(EqualJitterBackoff, 0.5), (FullJitterBackoff, 0.0)])
def test_jitter_stays_within_its_bounds_and_spreads(kind, low):
    backoff = kind(cap=0.8, base=0.1, rng=random.Random(7))
    for failures in range(1, 8):
        ceiling = min(0.8, 0.1 * 2 ** (failures - 1))
        draws = [backoff.compute(failures) for _ in range(2000)]
        assert min(draws) >= low * ceiling and max(draws) <= ceiling
        # Spread over the whole interval, not stuck at one end (uniform: mean in the middle).
        assert max(draws) - min(draws) > 0.9 * (1 - low) * ceiling
        assert statistics.fmean(draws) == pytest.approx((1 + low) / 2 * ceiling, rel=0.05)
    assert backoff.compute(0) == 0.0


def test_jitter_is_drawn_from_the_given_generator():
    a = EqualJitterBackoff(cap=10.0, base=1.0, rng=random.Random(3))
    b = EqualJitterBackoff(cap=10.0, base=1.0, rng=random.Random(3))
    sequence = [a.compute(n) for n in range(1, 6)]
    assert sequence == [b.compute(n) for n in range(1, 6)]
    assert len(set(sequence)) == 5
    # Two strategies with their own generators (two replicas) do not wait alike.
    c, d = EqualJitterBackoff(cap=10.0, base=1.0), EqualJitterBackoff(cap=10.0, base=1.0)
    assert [c.compute(4) for _ in range(5)] != [d.compute(4) for _ in range(5)]
