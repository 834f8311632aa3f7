"""Waiting in tests for something another thread or process makes true."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def until(condition: Callable[[], bool], timeout: float = 30.0, interval: float = 0.05) -> bool:
    """Poll ``condition`` until it holds (``True``) or ``timeout`` seconds pass (``False``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return False


async def until_async(
    condition: Callable[[], bool], timeout: float = 30.0, interval: float = 0.01
) -> bool:
    """:func:`until` on an event loop: the loop runs other tasks between the polls."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(interval)
    return False


def settled(
    read: Callable[[], float],
    tolerance: float,
    samples: int = 5,
    interval: float = 0.1,
    timeout: float = 30.0,
) -> float:
    """Poll ``read()`` until ``samples`` readings in a row lie within ``tolerance`` of each
    other (a value that stopped moving, e.g. a process's memory once its work is done);
    returns the last one.  Raises AssertionError naming the readings after ``timeout``."""
    deadline = time.monotonic() + timeout
    recent = [read()]
    while time.monotonic() < deadline:
        time.sleep(interval)
        recent = [*recent[-(samples - 1) :], read()]
        if len(recent) == samples and max(recent) - min(recent) <= tolerance:
            return recent[-1]
    raise AssertionError(f"still moving after {timeout} s: {recent}")
