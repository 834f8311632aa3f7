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
