"""The circuit breaker's states, on a clock the test moves (no sleeps)."""

from __future__ import annotations

import pytest

from tierserve.ps.breaker import CLOSED, HALF_OPEN, OPEN, BreakerSet, CircuitBreaker
from tierserve.ps.retry import ExponentialBackoff


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def breaker(threshold=3, base=1.0, cap=4.0):
    clock = Clock()
    return CircuitBreaker(threshold, ExponentialBackoff(cap=cap, base=base), clock), clock


def test_opens_after_threshold_consecutive_failures_only():
    b, _ = breaker(threshold=3)
    b.failed()
    b.failed()
    b.succeeded()  # a success in between starts the count again
    b.failed()
    b.failed()
    assert b.state == CLOSED and b.allow()
    b.failed()
    assert b.state == OPEN and not b.allow()
    assert b.retry_in() == pytest.approx(1.0)


def test_one_probe_after_the_backoff_then_it_grows_until_a_success():
    b, clock = breaker(threshold=1, base=1.0, cap=4.0)
    b.failed()
    clock.now += 0.99
    assert not b.allow()
    clock.now += 0.02
    assert b.allow()  # the probe
    assert b.state == HALF_OPEN
    assert not b.allow() and not b.allow()  # others still skip while the probe runs
    b.failed()  # the probe failed: open again for twice as long
    assert b.state == OPEN and b.retry_in() == pytest.approx(2.0)
    clock.now += 2.01
    assert b.allow()
    b.failed()
    assert b.retry_in() == pytest.approx(4.0)
    clock.now += 4.01
    assert b.allow()
    b.failed()
    assert b.retry_in() == pytest.approx(4.0)  # capped
    clock.now += 4.01
    assert b.allow()
    b.succeeded()
    assert b.state == CLOSED and b.allow() and b.allow()
    b.failed()  # the back-off starts over after a success
    assert b.retry_in() == pytest.approx(1.0)


def test_a_probe_that_never_reports_is_replaced():
    b, clock = breaker(threshold=1, base=1.0)
    b.failed()
    clock.now += 1.5
    assert b.allow()  # probe taken, its caller never reports
    assert not b.allow()
    clock.now += 1.5
    assert b.allow()  # a new probe


def test_breaker_set_keeps_one_per_backend_and_rejects_bad_threshold():
    clock = Clock()
    breakers = BreakerSet(1, ExponentialBackoff(cap=1.0, base=1.0), clock)
    breakers["a"].failed()
    assert not breakers["a"].allow() and breakers["b"].allow()
    assert breakers.states() == {"a": OPEN, "b": CLOSED}
    with pytest.raises(ValueError, match="threshold"):
        CircuitBreaker(0)
