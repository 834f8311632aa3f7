"""Admission control: how many requests, and how many of their bytes, one worker holds.

One :class:`Budget` per worker process bounds the calls and request bytes in flight over
HTTP and gRPC together (``max_inflight_calls``, ``max_inflight_bytes``).  With the native
gRPC transport it is the transport's own (``tierserve_native.Budget``, whose waiters are
Rust tasks); otherwise :class:`LocalBudget`, the same interface in Python.  A request takes
its share before its body is read (an HTTP request its declared ``Content-Length``, a gRPC
call its message's length): one that finds no room waits, its body unread, and is refused
after ``admission_timeout_s`` with :class:`ServerBusyError` (503 / RESOURCE_EXHAUSTED).  The
HTTP front end's waiters are kept in :class:`Waiters`.

After a burst (bytes in flight high, then low again) the memory it used is handed back to
the OS (:class:`BurstTrim`): ``tierserve serve`` keeps freed memory in its heap otherwise
(server/runtime/allocator.py).  :func:`max_descriptor` turns ``descriptor_reserve`` into the highest
descriptor an accepted connection may have.
"""

from __future__ import annotations

import asyncio
import os
import resource
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from tierserve.core.errors import CapacityExceededError

from ..settings import Settings
from .allocator import LARGE_BODY, trimmer


class ServerBusyError(CapacityExceededError):
    """No room for the request within ``admission_timeout_s``: the client may retry later."""



def busy_error(settings: Settings) -> ServerBusyError:
    """The refusal of a request that found no room, naming the limits (as the native gRPC
    transport words it)."""
    return ServerBusyError(
        f"the server is busy: no room for this call within admission_timeout_s "
        f"({settings.admission_timeout_s:g} s) under max_inflight_calls "
        f"({settings.max_inflight_calls}), max_inflight_bytes ({settings.max_inflight_bytes}) "
        f"and max_connection_bytes ({settings.max_connection_bytes}); retry later"
    )


class Budget(Protocol):
    """Calls and bytes in flight (``tierserve_native.Budget`` or :class:`LocalBudget`)."""

    nbytes: int
    calls: int
    max_bytes: int
    max_calls: int

    def try_take(self, calls: int, nbytes: int) -> bool: ...

    def give(self, calls: int, nbytes: int) -> None: ...

    def take_peak(self) -> int: ...


class LocalBudget:
    """:class:`Budget` for one event loop, in Python (no native transport)."""

    def __init__(self, max_bytes: int, max_calls: int) -> None:
        self.max_bytes, self.max_calls = max_bytes, max_calls
        self.nbytes = self.calls = self._peak = 0

    def try_take(self, calls: int, nbytes: int) -> bool:
        if self.calls + calls > self.max_calls or self.nbytes + nbytes > self.max_bytes:
            return False
        self.calls += calls
        self.nbytes += nbytes
        self._peak = max(self._peak, self.nbytes)
        return True

    def give(self, calls: int, nbytes: int) -> None:
        self.calls -= calls
        self.nbytes -= nbytes

    def take_peak(self) -> int:
        peak, self._peak = self._peak, self.nbytes
        return peak


def make_budget(settings: Settings, native: bool) -> Budget:
    """The worker's budget: the native transport's when gRPC runs on it (``native``)."""
    if native:
        from tierserve_native import Budget as NativeBudget

        return NativeBudget(settings.max_inflight_bytes, settings.max_inflight_calls)
    return LocalBudget(settings.max_inflight_bytes, settings.max_inflight_calls)


class Waiters:
    """HTTP requests waiting for room in a :class:`Budget`, first come first served.

    ``wait(calls, nbytes, admitted, expired)`` queues a request; :meth:`admit` (called then,
    when the front end gives room back, and by its sweep, since gRPC gives room back in Rust)
    takes room for the oldest ones while it fits and calls their ``admitted()`` (which may
    thus run before ``wait`` returns).  Each waiter's ``expired()`` is called instead once
    ``timeout`` seconds pass.
    """

    def __init__(self, budget: Budget, timeout: float) -> None:
        self.budget = budget
        self.timeout = timeout
        self._queue: deque[_Waiter] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def wait(
        self, calls: int, nbytes: int, admitted: Callable[[], None], expired: Callable[[], None]
    ) -> _Waiter:
        waiter = _Waiter(calls, nbytes, admitted, expired, time.monotonic() + self.timeout)
        self._queue.append(waiter)
        self.admit()  # at once when there is room for it and for those before it
        return waiter

    def admit(self) -> None:
        queue = self._queue
        while queue:
            waiter = queue[0]
            if waiter.cancelled:
                queue.popleft()
            elif self.budget.try_take(waiter.calls, waiter.nbytes):
                queue.popleft()
                waiter.admitted()
            else:
                break
        if queue:
            now = time.monotonic()
            for waiter in [w for w in queue if w.deadline <= now and not w.cancelled]:
                waiter.cancelled = True
                waiter.expired()


class _Waiter:
    __slots__ = ("calls", "nbytes", "admitted", "expired", "deadline", "cancelled")

    def __init__(self, calls, nbytes, admitted, expired, deadline) -> None:
        self.calls, self.nbytes = calls, nbytes
        self.admitted, self.expired = admitted, expired
        self.deadline = deadline
        self.cancelled = False  # its connection went away, or it expired


class Admission:
    """The HTTP front end's side of a :class:`Budget`: its waiters and its refusal."""

    def __init__(self, budget: Budget, settings: Settings) -> None:
        self.budget = budget
        self.waiters = Waiters(budget, settings.admission_timeout_s)
        self.busy = busy_error(settings)
        #: bytes a request without a declared length (chunked) takes: the most it may send
        self.undeclared = settings.max_request_bytes

    def give(self, calls: int, nbytes: int) -> None:
        """Give back what a request held, and let waiters in."""
        self.budget.give(calls, nbytes)
        if self.waiters:
            self.waiters.admit()

    async def take(self, calls: int, nbytes: int) -> None:
        """Take room for a request, waiting for it up to ``admission_timeout_s``
        (:class:`ServerBusyError` then)."""
        if not self.waiters and self.budget.try_take(calls, nbytes):
            return
        future = asyncio.get_running_loop().create_future()

        def admitted() -> None:
            if future.done():  # its task was cancelled meanwhile
                self.give(calls, nbytes)
            else:
                future.set_result(None)

        def expired() -> None:
            if not future.done():
                future.set_exception(self.busy)

        waiter = self.waiters.wait(calls, nbytes, admitted, expired)
        try:
            await future
        except asyncio.CancelledError:
            waiter.cancelled = True
            if future.done() and not future.cancelled() and future.exception() is None:
                self.give(calls, nbytes)  # admitted just before the cancel reached it
            raise


class BurstTrim:
    """Hands a burst's memory back to the OS once it is over: checked every ``interval``
    seconds, when the bytes in flight peaked at ``threshold`` or more since the last trim and
    are now under an eighth of that peak, the heap is trimmed (:data:`~.allocator.trimmer`)."""

    def __init__(self, budget: Budget, threshold: int = LARGE_BODY, interval: float = 0.5):
        self.budget, self.threshold, self.interval = budget, threshold, interval
        self.peak = 0

    def check(self) -> bool:
        """Trim now if a burst just ended (True)."""
        self.peak = max(self.peak, self.budget.take_peak())
        now = self.budget.nbytes
        if self.peak >= self.threshold and now * 8 < self.peak:
            self.peak = now
            trimmer.after(0, LARGE_BODY)
            return True
        return False

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.check()


def max_descriptor(reserve: int) -> int:
    """The highest descriptor number (exclusive) an accepted connection may have so that
    ``reserve`` descriptors stay free: the kernel hands out the lowest free number, so a
    socket numbered N means N descriptors were open already."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft > 2**31 - 1:
        return 2**31 - 1
    return max(0, soft - reserve)


def open_descriptors() -> int:
    """Descriptors this process has open (0 where /proc is not there)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0
