"""A model-parallel embedding table: each rank holds the rows it owns, lookups and gradients
move between ranks with all-to-all exchanges of unique keys and vectors.

Ownership follows HugeCTR:

* ``DistributedSlotSparseEmbeddingHash``: every slot's keys are spread over all ranks, a key
  living on rank ``mix64(key) % size`` (:func:`tierserve.ps.partition.partition_of`, the
  codebase's one key mixer).
* ``LocalizedSlotSparseEmbeddingHash`` / ``OneHot``: whole slots are placed on ranks, slot
  ``s`` on rank ``s % size`` (a key's slot is the one it is seen in).

One lookup (``forward``): the batch's distinct keys are sent to their owners (one
``alltoallv`` of keys, with their slots for Localized types), each owner finds or adds the rows
and returns their vectors (one ``alltoallv`` of ``[n, dim]`` float32), and the rank pools them
as a one-process table would.  ``backward`` sends each distinct key's gradient back to its owner
(one ``alltoallv``), where gradients of a key from several ranks are summed and the optimizer
runs, so Adam/AdaGrad/... with Global, Local or LazyGlobal updates keep their semantics: a row
is updated exactly as in one process.  Initial vectors depend on ``(seed, key)`` only, so a row
starts the same wherever it lives.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tierserve.model.combine import (
    CsrLayout,
    check_csr,
    combine,
    embedding_gradients,
    scatter_sum,
    unique_rows,
)
from tierserve.ps.keys import as_keys
from tierserve.ps.partition import partition_of
from tierserve.ps.sparse_file import SparseTable, write_sparse_model

from ..embedding.table import (
    EmbeddingTable,
    read_sparse_optimizer_file,
    write_sparse_optimizer_file,
)


class ShardedTable:
    """Rank ``comm.rank``'s share of one embedding table, with :class:`EmbeddingTable`'s
    training and file interface.  Every method that exchanges is collective: all ranks call
    it, in the same order."""

    def __init__(self, local: EmbeddingTable, comm: Any) -> None:
        self.local = local
        self.comm = comm
        self.localized = local.embedding_type.is_localized
        self._saved: tuple | None = None
        self._stamp = np.empty(0, dtype=np.int64)
        #: distinct keys this rank looked up on other ranks (a running count, for benchmarks)
        self.remote_keys = 0

    def __getattr__(self, name: str) -> Any:  # name, dim, combiner, optimizer, freeze, ...
        return getattr(self.__dict__["local"], name)

    def __repr__(self) -> str:
        return f"ShardedTable(rank {self.comm.rank}/{self.comm.size}, {self.local!r})"

    # -- ownership --------------------------------------------------------------------------

    def owner_of(self, keys: np.ndarray, slots: np.ndarray | None = None) -> np.ndarray:
        """The rank that holds each key (int64)."""
        if self.localized and slots is not None:
            return np.asarray(slots, dtype=np.int64) % self.comm.size
        return partition_of(keys, self.comm.size)

    def _scratch(self, n: int) -> np.ndarray:
        if self._stamp.shape[0] < n:
            self._stamp = np.empty(max(n, 2 * self._stamp.shape[0]), dtype=np.int64)
        return self._stamp

    # -- training ---------------------------------------------------------------------------

    def forward(self, sparse_input: Any, combiner: str | None = None,
                training: bool = True) -> np.ndarray:
        """Pooled vectors ``[batch_size, slot_num, dim]`` of this rank's batch (collective)."""
        local = self.local
        combiner = local.combiner if combiner is None else combiner
        slot_num = int(sparse_input.slot_num)
        keys = as_keys(np.asarray(sparse_input.keys).reshape(-1), 64,
                       f"embedding {local.name!r}: keys")
        offsets = np.asarray(sparse_input.row_offsets).astype(np.int64, copy=False)
        check_csr(offsets, int(keys.shape[0]), slot_num)
        layout = CsrLayout(offsets, int(keys.shape[0]))
        uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
        slots = None
        if self.localized:
            slots = layout.row_of_key[first] % slot_num
        owner = self.owner_of(uniq, slots)
        # a stable sort of small integers is numpy's radix sort: linear, not n log n
        order = np.argsort(owner.astype(np.uint16 if self.comm.size <= 1 << 16 else np.int64),
                           kind="stable")
        counts = np.bincount(owner, minlength=self.comm.size).astype(np.int64)
        self.remote_keys += int(counts.sum() - counts[self.comm.rank])
        what = f"embedding {local.name!r} lookup"
        if self.localized:
            send = np.stack([uniq[order], slots[order]], axis=1)
            recv, recv_counts = self.comm.alltoallv(send, counts, what, row_shape=(2,))
            rows = local.rows_of(recv[:, 0], recv[:, 1])
        else:
            recv, recv_counts = self.comm.alltoallv(uniq[order], counts, what)
            rows = local.rows_of(recv)
        vectors = np.take(local._values, rows, axis=0)
        back = self.comm.alltoallv_known(vectors, recv_counts, counts, what + " (vectors)",
                                         row_shape=(local.dim,))
        per_unique = np.empty_like(back)
        per_unique[order] = back
        out = combine(np.take(per_unique, inverse, axis=0), offsets, slot_num, combiner, layout)
        self._saved = ((inverse, layout, combiner, order, counts, recv_counts, rows,
                        uniq.shape[0]) if training else None)
        return out

    def backward(self, grad_out: Any, lr: float, step: int) -> None:
        """Send each key's gradient to its owner, which sums them per row and applies the
        optimizer (collective; nothing moves when the table is frozen, on every rank)."""
        saved, self._saved = self._saved, None
        if self.local.frozen or saved is None:
            return
        inverse, layout, combiner, order, counts, recv_counts, rows, n_unique = saved
        local = self.local
        which, grads = embedding_gradients(inverse, np.asarray(grad_out, dtype=np.float32),
                                           layout, combiner, self._scratch(n_unique))
        per_unique = np.zeros((n_unique, local.dim), dtype=np.float32)
        per_unique[which] = grads
        recv = self.comm.alltoallv_known(per_unique[order], counts, recv_counts,
                                         f"embedding {local.name!r} gradients",
                                         row_shape=(local.dim,))
        distinct, index = unique_rows(rows, self._scratch(local._capacity))
        if distinct.shape[0] != rows.shape[0]:  # a key sent by several ranks: one sum per row
            recv = scatter_sum(recv, index, int(distinct.shape[0]))
        local.apply_gradients(distinct, recv, lr, step)

    # -- files ------------------------------------------------------------------------------

    def _owned(self) -> np.ndarray | slice:
        """The local rows this rank owns: all of them, except for a one-hot table, which
        every rank allocates whole (its keys are row numbers) but owns only its slots of."""
        if self.local._index is not None:
            return slice(None)
        return np.asarray(self.local._slot_ids[: self.local.num_rows]) % self.comm.size \
            == self.comm.rank

    def export(self) -> SparseTable:
        """The whole table (every rank's rows, rank order), on every rank (collective)."""
        part = self.local.export()
        owned = self._owned()
        part = SparseTable(keys=part.keys[owned], embeddings=part.embeddings[owned],
                           slot_ids=None if part.slot_ids is None else part.slot_ids[owned])
        keys, _ = self.comm.allgatherv(part.keys, "save: keys")
        emb, _ = self.comm.allgatherv(part.embeddings.reshape(-1, self.local.dim),
                                      "save: vectors")
        slot_ids = None
        if part.slot_ids is not None:
            slot_ids, _ = self.comm.allgatherv(part.slot_ids, "save: slot ids")
        return SparseTable(keys=keys, embeddings=emb, slot_ids=slot_ids)

    def save(self, folder: Any) -> None:
        """Rank 0 writes the whole table's sparse model folder (collective)."""
        table = self.export()
        if self.comm.rank == 0:
            write_sparse_model(folder, table.keys, table.embeddings, table.slot_ids)

    def save_optimizer_state(self, path: Any) -> None:
        """Rank 0 writes the whole table's optimizer state file (collective)."""
        local = self.local
        owned = self._owned()
        keys, _ = self.comm.allgatherv(np.asarray(local.keys, dtype=np.int64)[owned],
                                       "save: keys")
        states = {}
        for name, a in local.export_optimizer_state().items():
            states[name], _ = self.comm.allgatherv(a[owned], f"save: optimizer state {name}")
        if self.comm.rank == 0:
            write_sparse_optimizer_file(path, keys, states, local.optimizer)

    def _mine(self, keys: np.ndarray, slot_ids: np.ndarray | None) -> np.ndarray:
        return self.owner_of(keys, slot_ids if self.localized else None) == self.comm.rank

    def load(self, table: SparseTable) -> None:
        """Keep the rows of ``table`` this rank owns (any rank count wrote it)."""
        keys = np.asarray(table.keys, dtype=np.int64)
        slot_ids = None if table.slot_ids is None else np.asarray(table.slot_ids)
        mine = self._mine(keys, slot_ids)
        self.local.load(SparseTable(
            keys=keys[mine], embeddings=np.asarray(table.embeddings)[mine],
            slot_ids=None if table.slot_ids is None else np.asarray(table.slot_ids)[mine]))

    def load_optimizer_state_file(self, path: Any) -> None:
        """Keep the optimizer state of the rows this rank holds (load the model first)."""
        local = self.local
        keys, states = read_sparse_optimizer_file(path, local.optimizer, local.dim)
        if local._index is None:  # one-hot: every row of its slots lives here
            mine = np.isin(keys, np.asarray(local.keys))
        else:
            mine = np.asarray(local._index.lookup(keys)) >= 0
        local.load_optimizer_state(keys[mine], {k: v[mine] for k, v in states.items()})
