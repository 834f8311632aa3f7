"""The running side of a dataset pipeline: the block iterators behind ``map``, ``flat_map``,
``interleave``, ``shuffle`` and ``prefetch`` (:mod:`.dataset` holds the recipes that create
them).  Each pulls blocks from the stage before it, at most as many rows as the stage after it
needs (see :mod:`.dataset`)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError

from .csv_decode import DecodeCSVError
from .dataset_blocks import (
    _Block,
    _block_from_elements,
    _BlockIter,
    _Exact,
)
from .structure import _call, _located


class DatasetBase:
    """What every :class:`~tierserve.trainer.data.dataset.Dataset` is: a recipe whose
    ``_blocks()`` starts a run (the stages check that a function returned one)."""

    def _blocks(self) -> _BlockIter:
        raise NotImplementedError


class _MapIter(_BlockIter):
    def __init__(self, ds: Any, upstream: _BlockIter) -> None:
        self.ds, self.upstream = ds, upstream
        self.pool = ThreadPoolExecutor(ds.threads, "dataset-map") if ds.threads else None

    def _one(self, block: _Block, i: int) -> Any:
        try:
            return _call(self.ds.fn, block.element(i))
        except DecodeCSVError as exc:
            raise _located(exc, block.element_prov(i)) from None

    def pull(self, max_rows: int) -> _Block | None:
        block = self.upstream.pull(max_rows)
        if block is None:
            return None
        if self.pool is not None:
            outs = list(self.pool.map(lambda i: self._one(block, i), range(len(block))))
        else:
            outs = [self._one(block, i) for i in range(len(block))]
        return _block_from_elements(outs, block.prov)

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False)
        self.upstream.close()


class _FlatMapIter(_BlockIter):
    def __init__(self, outer: _BlockIter, fn: Callable[[Any], DatasetBase], where: str = "flat_map"):
        self.outer, self.fn, self.where = outer, fn, where
        self.inner: _BlockIter | None = None

    def pull(self, max_rows: int) -> _Block | None:
        while True:
            if self.inner is None:
                block = self.outer.pull(1)
                if block is None:
                    return None
                ds = _call(self.fn, block.element(0))
                if not isinstance(ds, DatasetBase):
                    raise InvalidInputError(
                        f"{self.where}: the function must return a Dataset, got {type(ds).__name__}"
                    )
                self.inner = ds._blocks()
            out = self.inner.pull(max_rows)
            if out is not None:
                return out
            self.inner.close()
            self.inner = None

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
        self.outer.close()


class _InterleaveIter(_BlockIter):
    """TensorFlow's interleave: slots opened as the cycle reaches them, ``block`` rows from
    the current slot, then the next slot; an exhausted slot is left, and refilled from the
    input when the cycle comes back to it.  While every slot is open and has whole rounds
    of rows, several rounds are cut at once with one reshape."""

    def __init__(self, outer: _BlockIter, fn, cycle: int, block: int, parallel: bool) -> None:
        self.outer, self.fn, self.cycle, self.block, self.parallel = (
            outer,
            fn,
            cycle,
            block,
            parallel,
        )
        self.slots: list[_Exact | None] = [None] * cycle
        self.index = 0  # the current slot
        self.taken = 0  # rows taken from it in this turn
        self.input_done = False

    def _open(self, i: int) -> bool:
        block = self.outer.pull(1)
        if block is None:
            self.input_done = True
            return False
        ds = _call(self.fn, block.element(0))
        if not isinstance(ds, DatasetBase):
            raise InvalidInputError(
                f"interleave: the function must return a Dataset, got {type(ds).__name__}"
            )
        inner = ds._blocks()
        if self.parallel:
            inner = _PrefetchIter(inner, ds._demand(), 1)
        self.slots[i] = _Exact(inner)
        return True

    def _advance(self) -> None:
        self.index, self.taken = (self.index + 1) % self.cycle, 0

    def pull(self, max_rows: int) -> _Block | None:
        parts, need = [], max_rows
        while need > 0:
            if self.taken == 0 and self.index == 0 and need >= self.cycle * self.block:
                rounds = self._rounds(need // (self.cycle * self.block))
                if rounds is not None:
                    parts.append(rounds)
                    need -= len(rounds)
                    continue
            slot = self.slots[self.index]
            if slot is None:
                if self.input_done or not self._open(self.index):
                    if all(s is None for s in self.slots):
                        break
                    self._advance()
                continue
            rows = slot.pull(min(self.block - self.taken, need))
            if rows is None:  # this dataset ended: leave the slot, go on
                slot.close()
                self.slots[self.index] = None
                self._advance()
                continue
            parts.append(rows)
            need -= len(rows)
            self.taken += len(rows)
            if self.taken == self.block:
                self._advance()
        return _Block.concat(parts) if parts else None

    def _rounds(self, k: int) -> _Block | None:
        """``k`` whole rounds at once, or None (rows pulled go back) when a slot is not open
        or has fewer rows."""
        if any(s is None for s in self.slots):
            return None
        got = []
        for slot in self.slots:
            rows = slot.pull(k * self.block)
            got.append(rows)
            if rows is None or len(rows) < k * self.block:
                break
        else:
            first = got[0]
            if all(g.tree == first.tree for g in got):
                arrays = []
                for parts in zip(*(g._arrays() for g in got)):
                    if len({p.shape[1:] for p in parts}) > 1:
                        break
                    stacked = np.stack(parts).reshape(
                        (self.cycle, k, self.block) + parts[0].shape[1:]
                    )
                    arrays.append(stacked.swapaxes(0, 1).reshape((-1,) + parts[0].shape[1:]))
                else:
                    if all((g.prov is None) == (first.prov is None) for g in got):
                        return first._rebuild(arrays)
        for slot, rows in zip(self.slots, got):  # give back what was pulled
            if rows is not None:
                slot.pending = rows if slot.pending is None else _Block.concat([rows, slot.pending])
        return None

    def close(self) -> None:
        for slot in self.slots:
            if slot is not None:
                slot.close()
        self.outer.close()


class _ShuffleIter(_BlockIter):
    """TensorFlow's shuffle buffer, a block of rows at a time.

    Each input row takes the place of a row drawn uniformly from the buffer, which is output;
    when several rows of one block draw the same place, the later one outputs the earlier
    one's row, exactly as one row at a time would.
    """

    def __init__(self, upstream: _BlockIter, size: int, rng: np.random.Generator) -> None:
        self.upstream, self.size, self.rng = _Exact(upstream), size, rng
        self.buf: _Block | None = None
        self.draining: _Block | None = None
        self.pos = 0
        self.done = False

    def pull(self, max_rows: int) -> _Block | None:
        if self.done:
            return None
        if self.draining is not None:  # the input ended: the buffer in a random order
            if self.pos >= len(self.draining):
                self.done, self.draining = True, None
                return None
            out = self.draining.slice(self.pos, self.pos + max_rows)
            self.pos += len(out)
            return out
        if self.buf is None:  # fill the buffer first
            self.buf = self.upstream.pull(self.size)
            if self.buf is None:
                self.done = True
                return None
            self.buf = self.buf.take(np.arange(len(self.buf)))  # own copy, writable
        incoming = None if len(self.buf) < self.size else self.upstream.pull(max_rows)
        if incoming is None:
            self.draining = self.buf.take(self.rng.permutation(len(self.buf)))
            self.pos = 0
            return self.pull(max_rows)
        return self._exchange(incoming)

    def _exchange(self, incoming: _Block) -> _Block:
        buf, m = self.buf, len(incoming)
        if incoming.tree != buf.tree:
            _Block.concat([buf.slice(0, 0), incoming.slice(0, 0)])  # raises the structure error
        slots = self.rng.integers(0, self.size, m)
        order = np.argsort(slots, kind="stable")
        sorted_slots = slots[order]
        first = np.empty(m, dtype=bool)
        first[0] = True
        first[1:] = sorted_slots[1:] != sorted_slots[:-1]
        last = np.empty(m, dtype=bool)
        last[-1] = True
        last[:-1] = first[1:]
        if (buf.prov is None) != (incoming.prov is None):  # mixed sources: no line numbers
            buf = _Block(buf.tree, buf.leaves)
            incoming = _Block(incoming.tree, incoming.leaves)
        b_arrays, i_arrays = buf._arrays(), incoming._arrays()
        out_arrays = []
        for j, (b, a) in enumerate(zip(b_arrays, i_arrays)):
            if b.shape[1:] != a.shape[1:]:
                raise InvalidInputError(
                    f"shuffle: elements have different shapes {b.shape[1:]} and {a.shape[1:]}"
                )
            if b.dtype != a.dtype:  # e.g. str columns of a wider width
                dtype = (
                    np.result_type(b.dtype, a.dtype) if object not in (a.dtype, b.dtype) else object
                )
                if dtype != b.dtype:
                    b = b_arrays[j] = b.astype(dtype)
            out = np.empty((m,) + a.shape[1:], dtype=b.dtype)
            out[order[first]] = b[sorted_slots[first]]
            repeated = ~first[1:]  # a later row of a repeated slot outputs the earlier row
            out[order[1:][repeated]] = a[order[:-1][repeated]]
            b[sorted_slots[last]] = a[order[last]]
            out_arrays.append(out)
        self.buf = buf._rebuild(b_arrays)
        return incoming._rebuild(out_arrays)

    def close(self) -> None:
        self.buf = self.draining = None
        self.upstream.close()


class _End:
    pass


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class _PrefetchIter(_BlockIter):
    """A background thread pulling ``per_item`` elements at a time into a bounded queue."""

    def __init__(self, upstream: _BlockIter, per_item: int, items: int) -> None:
        self.upstream, self.per_item = upstream, per_item
        self.queue: queue.Queue = queue.Queue(maxsize=items)
        self.stop = threading.Event()
        self.pending: _Block | None = None
        self.finished = False
        self.thread = threading.Thread(target=self._work, daemon=True, name="dataset-prefetch")
        self.thread.start()

    def _put(self, item: Any) -> bool:
        while not self.stop.is_set():
            try:
                self.queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def _work(self) -> None:
        try:
            while not self.stop.is_set():
                block = self.upstream.pull(self.per_item)
                if block is None:
                    self._put(_End())
                    return
                if not self._put(block):
                    return
        except BaseException as exc:  # raised in the consuming thread
            self._put(_Failure(exc))
        finally:
            self.upstream.close()

    def pull(self, max_rows: int) -> _Block | None:
        if self.pending is None:
            if self.finished:
                return None
            item = self.queue.get()
            if isinstance(item, _End):
                self.finished = True
                return None
            if isinstance(item, _Failure):
                self.finished = True
                raise item.error
            self.pending = item
        block = self.pending
        if len(block) > max_rows:
            self.pending = block.slice(max_rows, len(block))
            return block.slice(0, max_rows)
        self.pending = None
        return block

    def close(self) -> None:
        self.stop.set()
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        self.pending = None
