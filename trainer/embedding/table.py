"""The trainable sparse embedding table behind ``hugectr.SparseEmbedding``.

One :class:`EmbeddingTable` serves one ``SparseEmbedding`` layer, all slots of its sparse input
in one table (as HugeCTR's DistributedSlot embedding does: one hash table for every slot, keys
made distinct across slots by the reader's slot offsets), so a batch is one pass whatever the
number of slots.

Semantics, HugeCTR's unless said otherwise:

* Hash types map arbitrary int64 (or int32) keys to rows with :class:`KeyIndex`; a key gets a
  row the first time a batch holds it (in training and evaluation alike, as in HugeCTR, so the
  workspace must fit the evaluation vocabulary too).  ``LocalizedSlotSparseEmbeddingOneHot``
  takes keys that already are row numbers below ``sum(slot_size_array)`` and holds every row
  from the start.
* Capacity: ``workspace_size_per_gpu_in_mb`` bounds the rows to
  ``floor(MB * 2**20 / ((1 + state_copies) * 4 * embedding_vec_size))``, where ``state_copies``
  is the optimizer's state arrays per weight (Adam 2, +1 for LazyGlobal's ``prev_time``;
  AdaGrad, MomentumSGD, Nesterov 1; SGD 0; Ftrl 2), as HugeCTR's
  ``max_vocabulary_size_per_gpu``.  A batch that needs more raises
  :class:`CapacityExceededError` naming the embedding and the sizes.  Memory is allocated as
  the table grows, not up front.
* Initialisation (HugeCTR's ``init_embedding``): uniform in ``[-0.05, 0.05]``, except for
  Localized types given a ``slot_size_array``: ``[-b, b]`` with ``b = sqrt(1 / slot_size)``
  of the key's slot (``init_embedding_per_gpu``; always the case for OneHot).  The draw
  is a function of ``(seed, key)`` alone (a splitmix64 counter hash, see
  :func:`key_uniform`), so a key starts from the same vector whatever the batch order, the
  device or the table's growth.
* ``slot_ids`` (Localized types): the slot a key was first seen in (CSR row mod slot_num).
* The optimizer state file (``<prefix><i>_opt_sparse_<iter>.model``) is ours, not HugeCTR's
  raw GPU buffer dump; see :func:`write_sparse_optimizer_file`.
"""

from __future__ import annotations

import enum
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core.errors import CapacityExceededError, CorruptModelFileError, InvalidInputError
from tierserve.model.combine import (
    CsrLayout,
    check_combiner,
    check_csr,
    combine,
    embedding_gradients,
)
from tierserve.ps.atomic import atomic_write_file
from tierserve.ps.keys import as_keys
from tierserve.ps.partition import GOLDEN, SPLITMIX_M1, SPLITMIX_M2
from tierserve.ps.sparse_file import SparseTable, write_sparse_model

from ..optimizers import Optimizer, OptParamsPy, make_optimizer
from .key_index import KeyIndex


class Embedding_t(enum.Enum):  # noqa: N801 - HugeCTR's name
    """The embedding types of ``hugectr.Embedding_t``.  ``HybridSparseEmbedding`` (MLPerf) is
    named so scripts can spell it; ``SparseEmbedding`` refuses it with a message."""

    DistributedSlotSparseEmbeddingHash = "DistributedSlotSparseEmbeddingHash"
    LocalizedSlotSparseEmbeddingHash = "LocalizedSlotSparseEmbeddingHash"
    LocalizedSlotSparseEmbeddingOneHot = "LocalizedSlotSparseEmbeddingOneHot"
    HybridSparseEmbedding = "HybridSparseEmbedding"

    @property
    def is_localized(self) -> bool:
        return self is not Embedding_t.DistributedSlotSparseEmbeddingHash


def max_rows_for_workspace(
    workspace_size_per_gpu_in_mb: float, embedding_vec_size: int, num_state_copies: int
) -> int:
    """Rows a workspace holds: ``MB * 2**20 // ((1 + state copies) * 4 * dim)`` (HugeCTR)."""
    per_row = (1 + int(num_state_copies)) * 4 * int(embedding_vec_size)
    return int(float(workspace_size_per_gpu_in_mb) * (1 << 20)) // per_row


_MIN_CAPACITY = 1 << 12
DEFAULT_INIT_BOUND = 0.05  # HugeCTR's uniform(-0.05, 0.05) for hash tables
_INIT_CHUNK = 1 << 18


_GOLDEN = np.uint64(GOLDEN)
_MIX1 = np.uint64(SPLITMIX_M1)
_MIX2 = np.uint64(SPLITMIX_M2)
_SEED_MUL = 0xD1B54A32D192ED03


def key_uniform(keys: Any, seed: int, dim: int) -> Any:
    """Uniform(-1, 1) float32 ``[len(keys), dim]``, a pure function of ``(seed, key, column)``.

    Counter-based: ``h = splitmix64(key + seed * c)`` per key, then
    ``w = splitmix64(h + (i + 1) * golden)`` for word ``i``; columns ``2i`` and ``2i + 1``
    are bits 40-63 and 16-39 of ``w``.  No state, so any subset of keys can be drawn in any
    order, on numpy or cupy, with the same result.
    """
    xp = np if isinstance(keys, np.ndarray) else _array_module(keys)
    seed_term = np.uint64((int(seed) * _SEED_MUL) & 0xFFFFFFFFFFFFFFFF)
    h = keys.astype(xp.int64).view(xp.uint64) + seed_term
    _splitmix_inplace(xp, h, xp.empty_like(h))
    words = (dim + 1) // 2
    x = h[:, None] + xp.arange(1, words + 1, dtype=xp.uint64) * _GOLDEN
    tmp = xp.empty_like(x)
    _splitmix_inplace(xp, x, tmp)
    u = xp.empty((x.shape[0], words, 2), dtype=xp.float32)
    xp.right_shift(x, np.uint64(40), out=tmp)
    u[:, :, 0] = tmp
    xp.right_shift(x, np.uint64(16), out=tmp)
    tmp &= np.uint64(0xFFFFFF)
    u[:, :, 1] = tmp
    u = u.reshape(x.shape[0], 2 * words)[:, :dim]
    u *= np.float32(2.0 / (1 << 24))
    u -= np.float32(1.0)
    return u


def _splitmix_inplace(xp: Any, x: Any, tmp: Any) -> None:
    """splitmix64's finaliser on uint64 ``x`` in place (``tmp``: scratch of x's shape)."""
    x += _GOLDEN
    for shift, mul in ((30, _MIX1), (27, _MIX2)):
        xp.right_shift(x, np.uint64(shift), out=tmp)
        x ^= tmp
        x *= mul
    xp.right_shift(x, np.uint64(31), out=tmp)
    x ^= tmp


def _array_module(array: Any) -> Any:
    import cupy  # only reached with cupy arrays

    return cupy.get_array_module(array)


def _host(array: Any) -> np.ndarray:
    """A numpy array (a copy from the GPU for cupy)."""
    if isinstance(array, np.ndarray):
        return array
    return array.get()


def _key_array(xp: Any, keys: Any, what: str) -> Any:
    """``keys`` as a flat int64 array on ``xp``'s device; non-integer keys are an error.
    Host arrays follow :func:`tierserve.ps.keys.as_keys` (the readers hand 32-bit keys over
    as uint32, so they keep their unsigned values)."""
    if not hasattr(keys, "dtype"):
        keys = np.asarray(keys)
    if isinstance(keys, np.ndarray):
        return xp.asarray(as_keys(keys, 64, what))
    if not np.issubdtype(keys.dtype, np.integer):
        raise InvalidInputError(f"{what} must be integers, got dtype {keys.dtype}")
    return xp.ascontiguousarray(xp.asarray(keys).reshape(-1), dtype=xp.int64)


class EmbeddingTable:
    """One trainable embedding table: keys -> float32 vectors, with its optimizer state.

    ``forward`` pools the vectors of a :class:`SparseInput` batch and remembers what
    ``backward`` needs; ``backward`` sums the gradient per row and applies the optimizer
    (unless frozen).  ``export``/``load``, the optimizer-state methods and ``incremental``
    move the table to and from files and the parameter server.
    """

    def __init__(
        self,
        embedding_type: Embedding_t | str,
        embedding_vec_size: int,
        workspace_size_per_gpu_in_mb: float,
        optimizer: OptParamsPy | Optimizer,
        combiner: str = "sum",
        slot_size_array: list[int] | None = None,
        name: str = "sparse_embedding",
        seed: int = 0,
        xp: Any = np,
    ) -> None:
        self.embedding_type = _embedding_type(embedding_type)
        self.name = name
        self.dim = int(embedding_vec_size)
        if self.dim <= 0:
            raise InvalidInputError(f"embedding {name!r}: embedding_vec_size must be positive")
        self.combiner = check_combiner(combiner)
        self.optimizer = optimizer if isinstance(optimizer, Optimizer) else make_optimizer(
            optimizer)
        self.workspace_size_per_gpu_in_mb = workspace_size_per_gpu_in_mb
        self.max_rows = max_rows_for_workspace(
            workspace_size_per_gpu_in_mb, self.dim, self.optimizer.num_state_copies
        )
        self.seed = int(seed)
        self.xp = xp
        self.slot_size_array = None if slot_size_array is None else [
            int(s) for s in slot_size_array]
        if self.slot_size_array is not None and (
                any(s < 0 for s in self.slot_size_array) or not any(self.slot_size_array)):
            raise InvalidInputError(f"embedding {name!r}: slot_size_array entries must be >= 0 "
                                    "(0: the slot shares the next slot's vocabulary), not all 0")
        self._frozen = False
        self._saved: tuple[Any, CsrLayout, str] | None = None
        self._index = None if self.is_one_hot else KeyIndex(xp)
        self._n = 0
        self._capacity = 0
        self._values = xp.empty((0, self.dim), dtype=xp.float32)
        self._state = self.optimizer.init_state((0, self.dim), xp)
        self._stamp = xp.empty(0, dtype=xp.int64)
        self._dirty = xp.zeros(0, dtype=bool)
        self._slot_ids = xp.zeros(0, dtype=xp.int64) if self.embedding_type.is_localized else None
        # init bound: one value, or one per slot (Localized types with slot sizes)
        self._slot_bounds = None
        self._bound = DEFAULT_INIT_BOUND
        if self.embedding_type.is_localized and self.slot_size_array is not None:
            from ..data.records import shared_vocabulary_sizes

            sizes = shared_vocabulary_sizes(self.slot_size_array)
            self._slot_bounds = xp.asarray(
                [math.sqrt(1.0 / s) if s > 0 else DEFAULT_INIT_BOUND for s in sizes.tolist()],
                dtype=xp.float32,
            )
        if self.is_one_hot:
            self._init_one_hot()

    def __repr__(self) -> str:
        return (f"EmbeddingTable({self.name!r}, {self.embedding_type.value}, dim={self.dim}, "
                f"rows={self._n}/{self.max_rows}, optimizer={type(self.optimizer).__name__}/"
                f"{self.optimizer.update_type.value}{', frozen' if self._frozen else ''})")

    # ---- properties ---------------------------------------------------------------------

    @property
    def is_one_hot(self) -> bool:
        return self.embedding_type is Embedding_t.LocalizedSlotSparseEmbeddingOneHot

    @property
    def num_rows(self) -> int:
        """Rows (keys) the table holds."""
        return self._n

    @property
    def frozen(self) -> bool:
        return self._frozen

    @property
    def values(self) -> Any:
        """The live ``[num_rows, dim]`` float32 vectors (a view, on the table's device)."""
        return self._values[: self._n]

    @property
    def state(self) -> dict[str, Any]:
        """The live optimizer state arrays (views of their first ``num_rows`` rows)."""
        return {k: a[: self._n] for k, a in self._state.items()}

    @property
    def keys(self) -> Any:
        """The key of every row (int64 ``[num_rows]``, on the table's device)."""
        if self._index is None:
            return self.xp.arange(self._n, dtype=self.xp.int64)
        return self._index.keys

    def freeze(self) -> None:
        """Stop updating the table (``Model.freeze_embedding``); forward still adds new keys."""
        self._frozen = True

    def unfreeze(self) -> None:
        self._frozen = False

    # ---- storage ------------------------------------------------------------------------

    def _init_one_hot(self) -> None:
        if self.slot_size_array is None:
            raise InvalidInputError(
                f"embedding {self.name!r}: LocalizedSlotSparseEmbeddingOneHot needs "
                "slot_size_array"
            )
        total = sum(self.slot_size_array)
        self._check_capacity(total)
        self._reserve(total)
        xp = self.xp
        slots = xp.asarray(np.repeat(
            np.arange(len(self.slot_size_array), dtype=np.int64),
            np.asarray(self.slot_size_array, dtype=np.int64),
        ))
        bounds = self._slot_bounds[slots]
        for lo in range(0, total, _INIT_CHUNK):  # bounded temporaries for huge tables
            hi = min(total, lo + _INIT_CHUNK)
            self._values[lo:hi] = key_uniform(
                xp.arange(lo, hi, dtype=xp.int64), self.seed, self.dim
            ) * bounds[lo:hi, None]
        self._slot_ids[:total] = slots
        self._n = total

    def _check_capacity(self, needed: int) -> None:
        if needed > self.max_rows:
            raise CapacityExceededError(
                f"embedding {self.name!r} needs {needed} rows but workspace_size_per_gpu_in_mb="
                f"{self.workspace_size_per_gpu_in_mb} holds {self.max_rows} at "
                f"embedding_vec_size={self.dim} with {self.optimizer.num_state_copies} "
                f"optimizer state copies (rows = MB*2^20 / ((1 + copies) * 4 * dim)); "
                f"raise workspace_size_per_gpu_in_mb"
            )

    def _reserve(self, needed: int) -> None:
        """Grow the arrays to hold ``needed`` rows (doubling, capped at ``max_rows``)."""
        if needed <= self._capacity:
            return
        xp = self.xp
        old = self._capacity
        cap = min(max(needed, 2 * old, _MIN_CAPACITY), self.max_rows)
        values = xp.empty((cap, self.dim), dtype=xp.float32)
        values[:old] = self._values
        self._values = values
        state = self.optimizer.init_state((cap, self.dim), xp)
        for k, a in self._state.items():
            state[k][:old] = a
        self._state = state
        self._stamp = xp.zeros(cap, dtype=xp.int64)
        dirty = xp.zeros(cap, dtype=bool)
        dirty[:old] = self._dirty
        self._dirty = dirty
        if self._slot_ids is not None:
            slot_ids = xp.zeros(cap, dtype=xp.int64)
            slot_ids[:old] = self._slot_ids
            self._slot_ids = slot_ids
        self._capacity = cap

    def _rows_for(self, keys: Any, slots_of: Any = None) -> Any:
        """Rows of ``keys``, adding absent keys.  ``slots_of(positions)`` gives the slot of
        the keys at those positions (Localized types)."""
        xp = self.xp
        if self._index is None:
            if keys.shape[0] and (int(keys.min()) < 0 or int(keys.max()) >= self._n):
                raise InvalidInputError(
                    f"embedding {self.name!r} (one-hot): keys must lie in [0, {self._n}) = "
                    f"sum(slot_size_array); got {int(keys.min())}..{int(keys.max())}"
                )
            return keys
        rows = self._index.lookup(keys)
        new_keys, first_pos, where, inverse = self._index.absent(keys, rows)
        m = int(new_keys.shape[0])
        if m:
            self._check_capacity(self._n + m)
            self._reserve(self._n + m)
            new_rows = self._index.insert(new_keys)
            rows[where] = new_rows[inverse]
            lo, hi = self._n, self._n + m
            if self._slot_ids is not None and slots_of is not None:
                slots = slots_of(first_pos)
                self._slot_ids[lo:hi] = slots
                if self._slot_bounds is not None:
                    bounds = self._slot_bounds[xp.clip(slots, 0, len(self._slot_bounds) - 1)]
                    init = key_uniform(new_keys, self.seed, self.dim) * bounds[:, None]
                else:
                    init = self.initial_rows(new_keys)
            else:
                init = self.initial_rows(new_keys)
            self._values[lo:hi] = init
            self._n = hi
        return rows

    def initial_rows(self, keys: Any) -> Any:
        """The initial vectors of ``keys`` (``[len(keys), dim]`` float32, a function of the
        seed and the key): uniform in ``[-bound, bound]`` (HugeCTR's)."""
        return key_uniform(keys, self.seed, self.dim) * np.float32(self._bound)

    # ---- training -------------------------------------------------------------------------

    def forward(self, sparse_input: Any, combiner: str | None = None,
                training: bool = True) -> Any:
        """Pooled vectors ``[batch_size, slot_num, dim]`` float32 of a ``SparseInput``.

        Keys not in the table are added (initialised as the module docstring says).  With
        ``training`` the batch is kept for :meth:`backward`.
        """
        xp = self.xp
        combiner = self.combiner if combiner is None else check_combiner(combiner)
        slot_num = int(sparse_input.slot_num)
        keys = _key_array(xp, sparse_input.keys, f"embedding {self.name!r}: keys")
        offsets = xp.asarray(sparse_input.row_offsets).astype(xp.int64, copy=False)
        check_csr(offsets, int(keys.shape[0]), slot_num)
        if self._slot_bounds is not None and len(self.slot_size_array) != slot_num:
            raise InvalidInputError(
                f"embedding {self.name!r}: slot_size_array has {len(self.slot_size_array)} "
                f"entries but the sparse input has slot_num={slot_num}"
            )
        layout = CsrLayout(offsets, int(keys.shape[0]))

        def slots_of(positions: Any) -> Any:
            row = xp.searchsorted(offsets, positions, side="right") - 1
            return row % slot_num

        rows = self._rows_for(keys, slots_of)
        embeddings = xp.take(self._values, rows, axis=0)
        out = combine(embeddings, offsets, slot_num, combiner, layout)
        self._saved = (rows, layout, combiner) if training else None
        return out

    def gradients(self, grad_out: Any) -> tuple[Any, Any]:
        """``(rows, grads)`` of the last training forward: the distinct table rows and the
        loss gradient summed per row, for ``grad_out`` = d loss / d output."""
        if self._saved is None:
            raise InvalidInputError(
                f"embedding {self.name!r}: backward needs a forward with training=True first"
            )
        rows, layout, combiner = self._saved
        expected = layout.num_rows * self.dim
        if int(np.prod(grad_out.shape)) != expected:
            raise InvalidInputError(
                f"embedding {self.name!r}: gradient has shape {tuple(grad_out.shape)}, "
                f"expected [batch_size, slot_num, {self.dim}] with {layout.num_rows} "
                f"batch_size*slot_num rows ({expected} values)"
            )
        return embedding_gradients(rows, self.xp.asarray(grad_out), layout, combiner,
                                   self._stamp)

    def backward(self, grad_out: Any, lr: float, step: int) -> None:
        """Apply the optimizer to the rows of the last forward (nothing when frozen).

        ``step`` is the 1-based number of this update (Adam's bias correction and
        LazyGlobal's bookkeeping use it).
        """
        if self._frozen:
            self._saved = None
            return
        rows, grads = self.gradients(grad_out)
        self._saved = None
        self.apply_gradients(rows, grads, lr, step)

    def apply_gradients(self, rows: Any, grads: Any, lr: float, step: int) -> None:
        """Apply the optimizer to distinct ``rows`` with their summed gradients ``grads``
        (``[len(rows), dim]``); nothing when frozen.  The distributed trainer's entry."""
        if self._frozen:
            return
        self.optimizer.update_sparse(self._values, rows, grads, self._state, lr, step,
                                     num_rows=self._n)
        if self.optimizer.moves_untouched_rows:
            self._dirty[: self._n] = True
        else:
            self._dirty[rows] = True

    def rows_of(self, keys: Any, slots: Any = None) -> Any:
        """The rows of int64 ``keys``, adding absent ones (initialised as :meth:`forward`
        does); ``slots`` gives each key's slot (Localized types).  The distributed
        trainer's entry: a rank looks up the keys other ranks sent it."""
        keys = _key_array(self.xp, keys, f"embedding {self.name!r}: keys")
        return self._rows_for(keys, None if slots is None else (lambda pos: slots[pos]))

    # ---- files and the parameter server ----------------------------------------------------

    def export(self) -> SparseTable:
        """The table as host arrays, in row order (first-seen key order; one-hot: key order)."""
        slot_ids = None if self._slot_ids is None else _host(self._slot_ids[: self._n]).copy()
        return SparseTable(
            keys=_host(self.keys).astype(np.int64, copy=True),
            embeddings=_host(self.values).copy(),
            slot_ids=slot_ids,
        )

    def save(self, folder: str | os.PathLike) -> Path:
        """Write the sparse model folder (``key``, ``emb_vector``[, ``slot_id``]) atomically."""
        table = self.export()
        return write_sparse_model(folder, table.keys, table.embeddings, table.slot_ids)

    def load(self, table: SparseTable) -> None:
        """Set the vectors (and slot ids) of ``table``'s keys, adding keys not yet present."""
        if len(table) and table.dim != self.dim:
            raise InvalidInputError(
                f"embedding {self.name!r} has embedding_vec_size {self.dim} but the sparse "
                f"model holds vectors of {table.dim}"
            )
        xp = self.xp
        keys = _key_array(xp, np.asarray(table.keys), "sparse model keys")
        slot_ids = None
        if table.slot_ids is not None and self._slot_ids is not None:
            slot_ids = xp.asarray(np.asarray(table.slot_ids, dtype=np.int64))
        rows = self._rows_for(keys, (lambda pos: slot_ids[pos]) if slot_ids is not None
                              else None)
        if len(table):
            self._values[rows] = xp.asarray(np.asarray(table.embeddings, dtype=np.float32))
        if slot_ids is not None:
            self._slot_ids[rows] = slot_ids

    def export_optimizer_state(self) -> dict[str, np.ndarray]:
        """The optimizer state, host arrays in :meth:`export`'s row order."""
        return {k: _host(a).copy() for k, a in self.state.items()}

    def load_optimizer_state(self, keys: Any, states: dict[str, Any]) -> None:
        """Set the optimizer state of ``keys`` (adding absent keys, as :meth:`load` does)."""
        xp = self.xp
        expected = set(self._state)
        if set(states) != expected:
            raise InvalidInputError(
                f"embedding {self.name!r}: optimizer state has {sorted(states)}, "
                f"expected {sorted(expected)}"
            )
        keys = _key_array(xp, np.asarray(keys), "optimizer state keys")
        rows = self._rows_for(keys)
        for k, a in states.items():
            self._state[k][rows] = xp.asarray(np.asarray(a, dtype=self._state[k].dtype))

    def save_optimizer_state(self, path: str | os.PathLike) -> Path:
        """Write ``<prefix><i>_opt_sparse_<iter>.model`` (see :func:`write_sparse_optimizer_file`)."""
        return write_sparse_optimizer_file(
            path, _host(self.keys), self.export_optimizer_state(), self.optimizer
        )

    def load_optimizer_state_file(self, path: str | os.PathLike) -> None:
        """Read a file :meth:`save_optimizer_state` wrote and apply it."""
        keys, states = read_sparse_optimizer_file(path, self.optimizer, self.dim)
        self.load_optimizer_state(keys, states)

    def incremental(self) -> tuple[np.ndarray, np.ndarray]:
        """``(keys int64, embeddings float32 [n, dim])`` of the rows the optimizer changed
        since the last call (HugeCTR's ``get_incremental_model``); resets the record.

        With a ``Global`` update of Adam, MomentumSGD or Nesterov every row moves each step,
        so every row counts as changed.
        """
        rows = self.xp.flatnonzero(self._dirty[: self._n])
        self._dirty[: self._n] = False
        keys = self.xp.take(self.keys, rows)
        return (_host(keys).astype(np.int64, copy=False),
                _host(self.xp.take(self._values, rows, axis=0)))


def _embedding_type(value: Embedding_t | str) -> Embedding_t:
    if isinstance(value, Embedding_t):
        return value
    try:
        return Embedding_t(str(value))
    except ValueError:
        names = ", ".join(Embedding_t.__members__)
        raise InvalidInputError(f"embedding_type must be one of {names}, got {value!r}") from None


# ---- the sparse optimizer-state file ----------------------------------------------------------


def write_sparse_optimizer_file(
    path: str | os.PathLike, keys: np.ndarray, states: dict[str, np.ndarray],
    optimizer: Optimizer,
) -> Path:
    """Write one table's optimizer state, atomically.  Layout (all little-endian, no header):

    ``key`` int64 ``[N]``; then each of ``optimizer.state_names`` in order as float32
    ``[N, dim]`` (Adam: ``m``, ``v``; AdaGrad: ``accum``; MomentumSGD: ``momentum``; Nesterov:
    ``accum``; Ftrl: ``z``, ``n``; SGD: none); then each of ``optimizer.row_state_names`` as
    int64 ``[N]`` (LazyGlobal Adam: ``prev_time``).  Row ``i`` of every block belongs to
    ``key[i]``, so the file stands on its own whatever the table's row order.
    """
    keys = np.ascontiguousarray(keys, dtype="<i8").reshape(-1)
    chunks = [keys.view(np.uint8)]
    for name in optimizer.state_names:
        chunks.append(np.ascontiguousarray(states[name], dtype="<f4").reshape(-1).view(np.uint8))
    for name in optimizer.row_state_names:
        chunks.append(np.ascontiguousarray(states[name], dtype="<i8").reshape(-1).view(np.uint8))
    atomic_write_file(path, chunks)
    return Path(path)


def read_sparse_optimizer_file(
    path: str | os.PathLike, optimizer: Optimizer, dim: int
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Read :func:`write_sparse_optimizer_file`'s layout: ``(keys, {state name: array})``."""
    path = Path(path)
    if not path.is_file():
        raise CorruptModelFileError(f"sparse optimizer state file {path} does not exist")
    per_key = 8 + 4 * dim * len(optimizer.state_names) + 8 * len(optimizer.row_state_names)
    size = path.stat().st_size
    if size % per_key:
        raise CorruptModelFileError(
            f"sparse optimizer state file {path} has {size} bytes, not a multiple of the "
            f"{per_key} bytes per key that {type(optimizer).__name__} with dim {dim} needs"
        )
    n = size // per_key
    raw = np.fromfile(path, dtype=np.uint8)
    keys = raw[: 8 * n].view("<i8").astype(np.int64)
    at = 8 * n
    states: dict[str, np.ndarray] = {}
    for name in optimizer.state_names:
        block = raw[at : at + 4 * dim * n]
        states[name] = block.view("<f4").astype(np.float32).reshape(n, dim)
        at += 4 * dim * n
    for name in optimizer.row_state_names:
        states[name] = raw[at : at + 8 * n].view("<i8").astype(np.int64)
        at += 8 * n
    return keys, states
