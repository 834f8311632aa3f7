"""One rank's share of every global batch, chosen while the data is decoded.

Under ``mpiexec -n N`` each global batch of ``batch_size`` samples is cut by sample index:
rank ``r`` trains on rows ``[lo, hi)`` of it (:func:`share`, the ``numpy.array_split``
shares, so shares differ by at most one sample).  A rank whose share is empty (an epoch's last
batch holding fewer samples than there are ranks) gets the batch's first sample as a
:class:`Placeholder`, which weighs nothing.  The ranks together train on exactly the batches
one process would, which is what makes an N-rank run equal a one-rank run.

:class:`BatchShares` knows, from the record count of every file of the source, which global
batch each record falls in, so a data reader's worker threads keep only their rank's records
of each decoded chunk (:meth:`BatchShares.keep`) and its training thread cuts batches of the
share's size (:meth:`BatchShares.need`): no rank assembles or slices the whole global batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tierserve.model.batch import Batch

from .records import Records


def share(n: int, rank: int, size: int) -> tuple[int, int]:
    """Rank ``rank``'s rows ``[lo, hi)`` of a batch of ``n`` samples."""
    base, extra = divmod(n, size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


class Placeholder(Batch):
    """One sample standing in for an empty share: weighs nothing (``batch_size`` 0)."""

    @property
    def batch_size(self) -> int:
        return 0


class BatchShares:
    """Rank ``rank`` of ``size``'s records of a source whose files (tasks, in reading order)
    hold ``counts`` records, cut into global batches of ``batch_size``; ``repeat``: the source
    is cycled forever and every batch is full (else the last batch of the pass is short)."""

    def __init__(
        self, counts: Sequence[int], batch_size: int, rank: int, size: int, repeat: bool
    ) -> None:
        self.counts = [int(c) for c in counts]
        self.prefix = np.concatenate(([0], np.cumsum(self.counts, dtype=np.int64)))
        self.total = int(self.prefix[-1])
        self.batch_size, self.rank, self.size, self.repeat = int(batch_size), rank, size, repeat

    def batch_len(self, b: int) -> int:
        """Samples in global batch ``b`` (0 past the end of an epoch-mode pass)."""
        if self.repeat:
            return self.batch_size
        return max(0, min(self.batch_size, self.total - b * self.batch_size))

    def need(self, b: int) -> tuple[int, bool]:
        """``(records, placeholder)`` of this rank's share of global batch ``b``: how many
        records the reader hands out for it (0: the pass has ended), and whether that is the
        one-sample placeholder of an empty share."""
        n = self.batch_len(b)
        if n == 0:
            return 0, False
        lo, hi = share(n, self.rank, self.size)
        return (1, True) if hi == lo else (hi - lo, False)

    def keep(self, task: int, first: int, n: int) -> np.ndarray:
        """Which of the ``n`` records decoded from record ``first`` of task number ``task``
        (counted across cycles of a repeated source) are this rank's: sorted positions."""
        tasks = len(self.counts)
        start = (task // tasks) * self.total + int(self.prefix[task % tasks]) + first
        g = np.arange(start, start + n, dtype=np.int64)
        b = g // self.batch_size
        offset = g - b * self.batch_size
        if self.repeat:
            lo, hi = share(self.batch_size, self.rank, self.size)
            if hi == lo:  # fewer samples in a batch than ranks: the placeholder
                return np.flatnonzero(offset == 0)
            return np.flatnonzero((offset >= lo) & (offset < hi))
        length = np.minimum(self.batch_size, self.total - b * self.batch_size)
        base, extra = np.divmod(length, self.size)
        lo = self.rank * base + np.minimum(self.rank, extra)
        hi = lo + base + (self.rank < extra)
        mine = (offset >= lo) & (offset < hi)
        mine |= (hi == lo) & (offset == 0)
        return np.flatnonzero(mine)


def take_records(records: Records, index: np.ndarray) -> Records:
    """The records at sorted positions ``index`` (a few runs of consecutive records: one
    slice per run)."""
    n = int(index.shape[0])
    if n == len(records):
        return records
    if n == 0:
        return records.slice(0, 0)
    breaks = np.flatnonzero(np.diff(index) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [n]))
    return Records.concat(
        [records.slice(int(index[a]), int(index[e - 1]) + 1) for a, e in zip(starts, ends)]
    )
