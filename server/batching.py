"""Dynamic batching: concurrent small requests to one model run as one batch.

A :class:`DynamicBatcher` belongs to one servable.  A request that finds the model idle runs
at once.  Requests that arrive while it runs queue up; a worker then takes them together, as
many as fit ``max_batch_size`` rows.  When the previous execution merged several requests
(the model is under concurrent load) the worker also waits up to ``max_delay_s`` for more to
arrive; a lone client never waits.  Executions run in a worker thread and each caller gets
its own rows back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .servables import Servable

log = logging.getLogger(__name__)


@dataclass
class _Pending:
    unit: Any
    size: int
    future: asyncio.Future


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
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task | None = None
        self._carry: _Pending | None = None
        self._lock: asyncio.Lock | None = None
        self._closed = False
        self._busy_recently = False

    async def submit(self, unit: Any) -> dict[str, np.ndarray]:
        """Run one prepared unit, alone when the model is idle, else merged with others."""
        loop = asyncio.get_running_loop()
        if self._closed:  # a request that picked this batcher just before a swap
            return await self._run_alone(loop, unit)
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._lock = asyncio.Lock()
            self._worker = loop.create_task(self._run(), name=f"batcher-{self.servable.name}")
        if self._queue.empty() and self._carry is None and not self._lock.locked():
            async with self._lock:  # idle: no queue hop, no waiting
                self._busy_recently = False
                return await self._run_alone(loop, unit)
        pending = _Pending(unit, int(unit.batch_size), loop.create_future())
        self._queue.put_nowait(pending)
        return await pending.future

    async def _run_alone(self, loop, unit: Any) -> dict[str, np.ndarray]:
        pending = _Pending(unit, int(unit.batch_size), None)
        outputs = await loop.run_in_executor(self.executor, self._execute, [pending])
        return outputs[0]

    async def close(self) -> None:
        """Finish what is queued, then stop the worker; later submits run unbatched."""
        self._closed = True
        if self._worker is None:
            return
        while self._queue and (not self._queue.empty() or self._lock.locked() or self._carry):
            await asyncio.sleep(0.001)
        self._worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._worker
        self._worker = None

    async def _gather(self, first: _Pending) -> list[_Pending]:
        assert self._queue is not None
        batch, rows = [first], first.size
        wait = self.max_delay_s if self._busy_recently else 0.0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while rows < self.max_batch_size:
            try:
                if self._queue.empty() and wait > 0:
                    timeout = deadline - loop.time()
                    if timeout <= 0:
                        break
                    item = await asyncio.wait_for(self._queue.get(), timeout)
                else:
                    item = self._queue.get_nowait()
            except (asyncio.QueueEmpty, asyncio.TimeoutError):
                break
            if rows + item.size > self.max_batch_size:
                self._carry = item
                break
            batch.append(item)
            rows += item.size
        return batch

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            first = self._carry or await self._queue.get()
            self._carry = None
            async with self._lock:
                batch = await self._gather(first)
                live = [p for p in batch if not p.future.cancelled()]
                if not live:
                    continue
                self._busy_recently = len(live) > 1
                try:
                    outputs = await loop.run_in_executor(self.executor, self._execute, live)
                except Exception as exc:  # delivered to every caller of this batch
                    for p in live:
                        if not p.future.done():
                            p.future.set_exception(exc)
                    continue
                for p, out in zip(live, outputs):
                    if not p.future.done():
                        p.future.set_result(out)

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
