"""The background topology refresher: requests coalesce, at most one refresh per interval,
a failing refresh is counted and the next request tries again; nothing waits for it."""

from __future__ import annotations

import threading
import time

import pytest
from polling import until

from tierserve.ps.topology import TopologyRefresher


class _Counting:
    """A refresh that records when it ran; fails while ``failing`` is set; with a ``hold``
    event, runs until it is set."""

    def __init__(self, hold: threading.Event | None = None) -> None:
        self.times: list[float] = []
        self.failing = False
        self.hold = hold

    def __call__(self) -> None:
        self.times.append(time.monotonic())
        if self.hold is not None:
            self.hold.wait(60)
        if self.failing:
            raise ConnectionError("no node answers")


def test_requests_coalesce_into_at_most_one_refresh_per_interval():
    refresh = _Counting()
    refresher = TopologyRefresher(refresh, 0.3, "test")
    try:
        started = time.monotonic()
        while time.monotonic() - started < 1.0:  # a second of requests is the load
            refresher.request()  # as every failed call would
            time.sleep(0.001)
        assert until(lambda: len(refresh.times) >= 1)
        gaps = [b - a for a, b in zip(refresh.times, refresh.times[1:])]
        assert all(g >= 0.3 for g in gaps), gaps
        assert len(refresh.times) <= 1 + 1.0 / 0.3 + 1, refresh.times
    finally:
        refresher.close()


def test_a_request_never_waits_for_the_refresh():
    hold = threading.Event()
    refresh = _Counting(hold)
    refresher = TopologyRefresher(refresh, 0.05, "test")
    watchdog = threading.Timer(30, hold.set)  # a request that waited would wait this long
    watchdog.start()
    try:
        refresher.request()
        assert until(lambda: refresh.times)
        refresher.request()  # while the first refresh runs
        assert not hold.is_set()  # it returned while the refresh was still held
    finally:
        watchdog.cancel()
        hold.set()
        refresher.close()


def test_a_failing_refresh_is_counted_and_tried_again_on_the_next_request():
    refresh = _Counting()
    refresh.failing = True
    refresher = TopologyRefresher(refresh, 0.05, "test")
    try:
        refresher.request()
        assert until(lambda: refresher.failures == 1)
        assert "no node answers" in refresher.last_error
        refresh.failing = False
        refresher.request()
        assert until(lambda: refresher.refreshes == 2)
        assert refresher.failures == 1
    finally:
        refresher.close()


def test_close_stops_the_thread_and_later_requests_do_nothing():
    refresh = _Counting()
    refresher = TopologyRefresher(refresh, 0.05, "test")
    refresher.request()
    assert until(lambda: refresh.times)
    refresher.close()
    assert not any(t.name == "tierserve-topology-test" for t in threading.enumerate())
    refresher.request()  # no thread is started again: nothing could run it
    assert not any(t.name == "tierserve-topology-test" for t in threading.enumerate())
    assert len(refresh.times) == 1


def test_the_interval_must_be_positive():
    with pytest.raises(ValueError, match="interval_s"):
        TopologyRefresher(lambda: None, 0, "test")
