"""Rank-aware reading: each rank reads its own share of every global batch.

Each global batch of ``batchsize`` samples is cut by sample index (:func:`share`): rank ``r``
of ``N`` trains on rows ``[r*B/N, (r+1)*B/N)`` of it.  The project's data readers select the
share while decoding (:meth:`~tierserve.trainer.data.reader.DataReader.shard`): from the
record counts in the files' headers each worker thread knows which global batch a decoded
record falls in and keeps only this rank's, so no rank decodes, assembles or slices the whole
batch (:mod:`tierserve.trainer.data.shard`).  A reader without that support is read whole and
each batch sliced.

A rank whose share is empty (the last batch of an epoch holding fewer samples than there are
ranks) gets the batch's first sample as a :class:`Placeholder`: it runs the step (every rank
must join the exchanges) with weight 0, and its keys are the batch's, so no row changes
because of it.  The ranks together therefore train on exactly the batches one process would,
which is what makes an N-rank run equal a one-rank run with the same global batch.

The file list is not split by rank: a rank reading whole files of its own would train on
other global batches than one process does.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tierserve.model.batch import Batch, SparseInput

from ..data.reader import DataReader
from ..data.shard import Placeholder, share

__all__ = ["Placeholder", "ShardedReader", "share", "slice_batch"]


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


class ShardedReader:
    """A model's reader handle (``next_batch``, ``set_source``, ``is_eof``) that yields this
    rank's share of each batch."""

    def __init__(self, inner: Any, rank: int, size: int) -> None:
        self.inner, self.rank, self.size = inner, rank, size
        #: whether the last batch handed out was a placeholder (metrics skip it)
        self.placeholder = False
        reader = getattr(inner, "reader", None)
        #: whether the data reader selects the share itself (else batches are sliced here)
        self.selects = size > 1 and isinstance(reader, DataReader)
        if self.selects:
            reader.shard(rank, size)

    def next_batch(self) -> Batch | None:
        batch = self.inner.next_batch()
        if batch is None or self.selects:
            self.placeholder = isinstance(batch, Placeholder)
            return batch
        lo, hi = share(batch.batch_size, self.rank, self.size)
        self.placeholder = hi == lo
        if self.placeholder:
            first = slice_batch(batch, 0, 1)
            return Placeholder(label=first.label, dense=first.dense, sparse=first.sparse)
        return slice_batch(batch, lo, hi)

    def __getattr__(self, name: str) -> Any:  # set_source, is_eof, close, reader
        return getattr(self.__dict__["inner"], name)
