"""Rank-aware reading: each rank trains on its share of every global batch.

The source is read as one process would read it and each global batch of ``batchsize``
samples is cut by sample index: rank ``r`` of ``N`` keeps rows ``[r*B/N, (r+1)*B/N)`` (the
``numpy.array_split`` shares, so shares differ by at most one sample).  A rank whose share is
empty (the last batch of an epoch holding fewer samples than there are ranks) gets the
batch's first sample as a :class:`Placeholder`: it runs the step (every rank must join the
exchanges) with weight 0, and its keys are the batch's, so no row changes because of it.  The ranks together
therefore train on exactly the batches one process would, which is what makes an N-rank run
equal a one-rank run with the same global batch.  Each rank decodes the whole source; its
reader threads run beside training.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..data.batch import Batch, SparseInput


def share(n: int, rank: int, size: int) -> tuple[int, int]:
    """Rank ``rank``'s rows ``[lo, hi)`` of a batch of ``n`` samples."""
    base, extra = divmod(n, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


def slice_batch(batch: Batch, lo: int, hi: int) -> Batch:
    """Samples ``[lo, hi)`` of ``batch``."""
    sparse = []
    for s in batch.sparse:
        offsets = np.asarray(s.row_offsets)
        a, b = int(offsets[lo * s.slot_num]), int(offsets[hi * s.slot_num])
        sparse.append(SparseInput(keys=s.keys[a:b],
                                  row_offsets=offsets[lo * s.slot_num : hi * s.slot_num + 1] - a,
                                  slot_num=s.slot_num))
    return Batch(label=batch.label[lo:hi], dense=batch.dense[lo:hi], sparse=tuple(sparse))


class Placeholder(Batch):
    """One sample standing in for an empty share: weighs nothing (``batch_size`` 0)."""

    @property
    def batch_size(self) -> int:
        return 0


class ShardedReader:
    """A model's reader handle (``next_batch``, ``set_source``, ``is_eof``) that yields this
    rank's share of each batch."""

    def __init__(self, inner: Any, rank: int, size: int) -> None:
        self.inner, self.rank, self.size = inner, rank, size
        #: whether the last batch handed out was a placeholder (metrics skip it)
        self.placeholder = False

    def next_batch(self) -> Batch | None:
        batch = self.inner.next_batch()
        if batch is None:
            return None
        lo, hi = share(batch.batch_size, self.rank, self.size)
        self.placeholder = hi == lo
        if self.placeholder:
            first = slice_batch(batch, 0, 1)
            return Placeholder(label=first.label, dense=first.dense, sparse=first.sparse)
        return slice_batch(batch, lo, hi)

    def __getattr__(self, name: str) -> Any:  # set_source, is_eof, close, reader
        return getattr(self.__dict__["inner"], name)
