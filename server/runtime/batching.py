"""Dynamic batching: concurrent small requests to one model run as one batch.

A :class:`DynamicBatcher` belongs to one servable and lives on the server's event loop.  A
request that finds the model idle leads a batch: it yields the loop once (under concurrent
load, when an execution of the last :data:`MERGED_WINDOW_S` merged several requests, for up
to ``max_delay_s``) so that
requests ready at the same time, REST and gRPC alike, join the pending list, then runs the
batch itself.  Requests arriving while a batch runs wait for the next flush.  A flush takes
as many requests as fit ``max_batch_size`` rows, merges them, runs the model and hands each
caller its own rows.

Every execution runs in the executor, one at a time, while new requests queue up: lookups
may wait on a network tier (a frozen Redis holds a call for its socket timeout), so nothing
of the model ever runs on the event loop thread, which must stay free for health checks and
the next requests.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

import numpy as np

from tierserve.core.errors import RequestCancelledError

from .servables import Servable

log = logging.getLogger(__name__)


#: How long after an execution that merged requests a lone request still waits for more.
MERGED_WINDOW_S = 0.1

#: ``callback(outputs, None)`` or ``callback(None, exception)``, called on the event loop.
Callback = Callable[[Any, BaseException | None], None]


class _Pending:
    """A request waiting for its batch: it gets its outputs through ``future`` (a coroutine
    awaits it) or ``callback`` (no coroutine: :meth:`DynamicBatcher.enqueue`, where
    ``alive()`` turning false means its client gave up)."""

    __slots__ = ("unit", "size", "future", "callback", "alive")

    def __init__(
        self,
        unit: Any,
        size: int,
        future: asyncio.Future | None,
        callback: Callback | None = None,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        self.unit = unit
        self.size = size
        self.future = future
        self.callback = callback
        self.alive = alive

    def cancelled(self) -> bool:
        if self.future is not None:
            return self.future.cancelled()
        return self.alive is not None and not self.alive()

    def resolve(self, outputs: Any, exc: BaseException | None) -> None:
        if self.callback is not None:
            callback, self.callback = self.callback, None
            try:
                callback(outputs, exc)
            except Exception:  # one caller's failure never keeps the others' answers
                log.exception("a batched request's callback failed")
        elif self.future is not None and not self.future.done():
            if exc is None:
                self.future.set_result(outputs)
            else:
                self.future.set_exception(exc)


class DynamicBatcher:
    """Coalesces requests to ``servable`` up to ``max_batch_size`` rows; see module docstring."""

    def __init__(
        self,
        servable: Servable,
        executor: Executor | None,
        max_batch_size: int | None = None,
        max_delay_s: float = 0.001,
        on_batch: Callable[[int, int], None] | None = None,
    ) -> None:
        self.servable = servable
        self.executor = executor
        self.max_batch_size = max_batch_size or servable.max_batch_size
        self.max_delay_s = max_delay_s
        self.on_batch = on_batch  # (rows, requests) of every execution, for metrics
        self._pending: list[_Pending] = []
        self._rows = 0
        self._scheduled: asyncio.Handle | None = None
        self._running: asyncio.Future | None = None  # an execution in the executor
        self._merged_at = -MERGED_WINDOW_S  # loop time of the last execution that merged
        self._leader: _Pending | None = None
        self._closed = False

    @property
    def running(self) -> bool:
        """Whether an execution is in the executor now (tests wait on it)."""
        return self._running is not None

    @property
    def queued(self) -> int:
        """Requests waiting for a batch (tests wait on it)."""
        return len(self._pending)

    def waiting(self) -> int:
        """Queued requests whose client still waits for them (tests wait on it)."""
        return sum(not p.cancelled() for p in list(self._pending))

    async def submit(self, unit: Any) -> dict[str, np.ndarray]:
        """Run one prepared unit, merged with whatever else is ready; returns its outputs."""
        loop = asyncio.get_running_loop()
        pending = _Pending(unit, int(unit.batch_size), loop.create_future())
        if self._closed:  # a request that picked this batcher just before a swap
            return (await loop.run_in_executor(self.executor, self._execute, [pending]))[0]
        self._pending.append(pending)
        self._rows += pending.size
        if self._leader is None and self._running is None and self._scheduled is None:
            # Idle: this request leads.  It yields the loop once so requests that are ready
            # too can join, then runs the batch itself (no callback hop for the common case).
            self._leader = pending
            try:
                if self._merged_recently(loop) and self._rows < self.max_batch_size:
                    await asyncio.sleep(self.max_delay_s)
                else:
                    await asyncio.sleep(0)
            finally:
                self._leader = None
            if not pending.future.done():
                self._flush(loop)
            return await pending.future
        self._schedule(loop)
        return await pending.future

    def enqueue(
        self, unit: Any, callback: Callback, alive: Callable[[], bool] | None = None
    ) -> None:
        """Run one prepared unit as :meth:`submit` does, without a coroutine: ``callback``
        gets its outputs (or the exception) on the event loop.  Call it on the loop.  When
        ``alive()`` is false by the time its batch is taken, the unit does not run and
        ``callback`` gets :class:`~tierserve.core.errors.RequestCancelledError`."""
        loop = asyncio.get_running_loop()
        pending = _Pending(unit, int(unit.batch_size), None, callback, alive)
        if self._closed:
            future = loop.run_in_executor(self.executor, self._execute, [pending])
            future.add_done_callback(lambda f: self._finished_alone(pending, f))
            return
        self._pending.append(pending)
        self._rows += pending.size
        self._schedule(loop)

    @staticmethod
    def _finished_alone(pending: _Pending, future: asyncio.Future) -> None:
        if future.cancelled():
            pending.resolve(None, asyncio.CancelledError())
        elif future.exception() is not None:
            pending.resolve(None, future.exception())
        else:
            pending.resolve(future.result()[0], None)

    def _merged_recently(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether requests overlapped lately (concurrent clients): then a lone request
        waits for company.  Not only the last execution: where requests arrive one per loop
        step (gRPC), executions alternate between one request and a few, and a flag of the
        last one alone kept most of them unbatched."""
        return loop.time() - self._merged_at < MERGED_WINDOW_S

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._scheduled is not None or self._running is not None or self._leader is not None:
            return  # a flush is due, or the running execution flushes when it ends
        if self._rows >= self.max_batch_size or not self._merged_recently(loop):
            self._scheduled = loop.call_soon(self._flush, loop)
        else:
            self._scheduled = loop.call_later(self.max_delay_s, self._flush, loop)

    def _take(self) -> list[_Pending]:
        batch, rows = [], 0
        while self._pending and (not batch or rows + self._pending[0].size <= self.max_batch_size):
            item = self._pending.pop(0)
            if item.cancelled():  # its client gave up: it does not run
                self._rows -= item.size
                item.resolve(None, RequestCancelledError(
                    "the client gave up on the request (deadline, cancel or hang-up) before "
                    "it ran"
                ))  # fmt: skip
                continue
            batch.append(item)
            rows += item.size
        self._rows -= rows
        return batch

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        self._scheduled = None
        batch = self._take()
        if batch:
            if len(batch) > 1:
                self._merged_at = loop.time()
            self._running = loop.run_in_executor(self.executor, self._execute, batch)
            self._running.add_done_callback(lambda f: self._finished(loop, batch, f))
            return
        if self._pending:
            self._schedule(loop)

    def _finished(self, loop, batch: list[_Pending], future: asyncio.Future) -> None:
        self._running = None
        if future.cancelled():
            self._fail(batch, asyncio.CancelledError())
        elif future.exception() is not None:
            self._fail(batch, future.exception())
        else:
            self._deliver(batch, future.result())
        if self._pending:
            self._schedule(loop)

    @staticmethod
    def _deliver(batch: list[_Pending], outputs: list[dict[str, np.ndarray]]) -> None:
        for p, out in zip(batch, outputs):
            p.resolve(out, None)

    @staticmethod
    def _fail(batch: list[_Pending], exc: BaseException) -> None:
        for p in batch:
            p.resolve(None, exc)

    async def close(self) -> None:
        """Finish what is pending; later submits run on their own."""
        self._closed = True
        while self._pending or self._scheduled is not None or self._running is not None:
            await asyncio.sleep(0.001)

    def _execute(self, batch: list[_Pending]) -> list[dict[str, np.ndarray]]:
        units = [p.unit for p in batch]
        unit = units[0] if len(units) == 1 else self.servable.merge(units)
        outputs = self.servable.execute(unit)
        sizes = [p.size for p in batch]
        if self.on_batch is not None:
            self.on_batch(sum(sizes), len(sizes))
        if len(batch) == 1:
            return [outputs]
        cuts = np.cumsum(sizes)[:-1]
        split = {name: np.split(array, cuts) for name, array in outputs.items()}
        return [{name: parts[i] for name, parts in split.items()} for i in range(len(batch))]
