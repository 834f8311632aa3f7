"""The embedding layer's arithmetic on CSR batches, free of any table: forward and gradients.

A sparse input of ``batch_size`` samples and ``slot_num`` slots is CSR: row
``r = sample * slot_num + slot`` owns ``keys[row_offsets[r]:row_offsets[r + 1]]``.  The layer
output for a row is the sum (``"sum"``) or the mean (``"mean"``) of its keys' embeddings; an
empty row gives zeros.  :func:`combine` is what the inference server reuses;
:func:`embedding_gradients` is the backward pass down to one summed gradient per table row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError
from tierserve.model.cpu_kernels import unique_sum, use_kernels

COMBINERS = ("sum", "mean")


def _xp_of(array: Any) -> Any:
    if isinstance(array, np.ndarray):
        return np
    import cupy  # only reached with cupy arrays

    return cupy.get_array_module(array)


def check_combiner(combiner: str) -> str:
    """``combiner`` if it is ``"sum"`` or ``"mean"``, else :class:`InvalidInputError`."""
    if combiner not in COMBINERS:
        raise InvalidInputError(f"combiner must be 'sum' or 'mean', got {combiner!r}")
    return combiner


def check_csr(row_offsets: Any, nnz: int, slot_num: int) -> int:
    """Validate CSR row offsets for ``nnz`` keys and return the batch size."""
    n = int(row_offsets.shape[0]) - 1
    if row_offsets.ndim != 1 or n < 0:
        raise InvalidInputError(
            f"row_offsets must be 1-D with batch_size*slot_num+1 entries, "
            f"got shape {tuple(row_offsets.shape)}"
        )
    if slot_num <= 0 or n % slot_num:
        raise InvalidInputError(
            f"row_offsets has {n} rows, not a multiple of slot_num={slot_num}"
        )
    if n and (int(row_offsets[0]) != 0 or int(row_offsets[-1]) != nnz):
        raise InvalidInputError(
            f"row_offsets must run from 0 to the number of keys ({nnz}), "
            f"got {int(row_offsets[0])}..{int(row_offsets[-1])}"
        )
    if n == 0 and nnz:
        raise InvalidInputError(f"row_offsets describe no rows but there are {nnz} keys")
    return n // slot_num


class CsrLayout:
    """How keys fall into CSR rows, computed once per batch and shared by forward and backward.

    ``kind`` is ``"one_hot"`` (every row holds exactly one key: the common DLRM case, where
    nothing needs gathering), ``"fixed"`` (every row holds ``width`` keys) or ``"ragged"``.
    """

    def __init__(self, row_offsets: Any, nnz: int) -> None:
        xp = _xp_of(row_offsets)
        self.xp = xp
        self.row_offsets = row_offsets
        self.num_rows = int(row_offsets.shape[0]) - 1
        self.nnz = int(nnz)
        self.counts = xp.diff(row_offsets)
        if self.num_rows and self.nnz % self.num_rows == 0 and bool(
            (self.counts == self.nnz // self.num_rows).all()
        ):
            self.width = self.nnz // self.num_rows
            self.kind = "one_hot" if self.width == 1 else "fixed"
        else:
            if bool((self.counts < 0).any()):
                raise InvalidInputError("row_offsets must not decrease")
            self.width = 0
            self.kind = "ragged"
        self._row_of_key: Any = None

    @property
    def row_of_key(self) -> Any:
        """The CSR row of every key (int64 ``[nnz]``)."""
        if self._row_of_key is None:
            xp = self.xp
            rows = xp.arange(self.num_rows, dtype=xp.int64)
            if self.kind == "one_hot":
                self._row_of_key = rows
            elif self.kind == "fixed":
                self._row_of_key = xp.repeat(rows, self.width)
            elif xp is np:
                self._row_of_key = np.repeat(rows, self.counts.astype(np.int64))
            else:  # cupy's repeat takes no array of counts
                positions = xp.arange(self.nnz, dtype=xp.int64)
                self._row_of_key = xp.searchsorted(self.row_offsets, positions, side="right") - 1
        return self._row_of_key

    def row_scale(self, combiner: str) -> Any:
        """Per-row factor of ``combiner``: 1 for sum, ``1/count`` (1 for empty rows) for mean."""
        xp = self.xp
        if combiner == "sum" or self.kind == "one_hot":
            return None
        return (1.0 / xp.maximum(self.counts, 1)).astype(xp.float32)


def combine(
    embeddings: Any,
    row_offsets: Any,
    slot_num: int,
    combiner: str = "sum",
    layout: CsrLayout | None = None,
) -> Any:
    """Pool the embeddings of each CSR row: ``[nnz, dim]`` -> ``[batch_size, slot_num, dim]``.

    ``embeddings[i]`` is the vector of the i-th key.  ``combiner`` is ``"sum"`` or ``"mean"``;
    empty rows give zeros.  Float32 in, float32 out; numpy or cupy alike.  When every row
    holds exactly one key the result is ``embeddings`` itself, reshaped (no copy).
    """
    check_combiner(combiner)
    xp = _xp_of(embeddings)
    if embeddings.ndim != 2:
        raise InvalidInputError(f"embeddings must be [nnz, dim], got {tuple(embeddings.shape)}")
    nnz, dim = int(embeddings.shape[0]), int(embeddings.shape[1])
    if layout is None:
        batch_size = check_csr(row_offsets, nnz, slot_num)
        layout = CsrLayout(row_offsets, nnz)
    else:
        batch_size = layout.num_rows // slot_num
    if layout.kind == "one_hot":
        out = embeddings
    elif layout.kind == "fixed":
        out = embeddings.reshape(layout.num_rows, layout.width, dim).sum(axis=1)
        if combiner == "mean":
            out *= 1.0 / layout.width
    else:
        out = _segment_sum(embeddings, layout)
        scale = layout.row_scale(combiner)
        if scale is not None:
            out *= scale[:, None]
    return xp.ascontiguousarray(out, dtype=xp.float32).reshape(batch_size, slot_num, dim)


def _segment_sum(values: Any, layout: CsrLayout) -> Any:
    """Sum ``values`` ([nnz, dim]) over the CSR rows; empty rows give zeros."""
    xp = layout.xp
    dim = int(values.shape[1])
    n = layout.num_rows
    if layout.nnz == 0:
        return xp.zeros((n, dim), dtype=xp.float32)
    return scatter_sum(values, layout.row_of_key, n)


def scatter_sum(values: Any, index: Any, n: int) -> Any:
    """``out[j] = sum(values[i] for i where index[i] == j)``, ``[n, dim]`` float32.

    numpy: one ``bincount`` per column (measured several times faster than ``np.add.at``,
    a sort + ``reduceat`` or a sort + ``cumsum``); cupy: an atomic scatter-add.
    """
    xp = _xp_of(values)
    dim = int(values.shape[1])
    if xp is np:
        out = np.empty((n, dim), dtype=np.float32)
        for d in range(dim):
            out[:, d] = np.bincount(index, weights=values[:, d], minlength=n)
        return out
    import cupyx  # only reached with cupy arrays

    out = xp.zeros((n, dim), dtype=xp.float32)
    cupyx.scatter_add(out, index, values)
    return out


def unique_rows(rows: Any, stamp: Any) -> tuple[Any, Any]:
    """Distinct table rows of a batch and, for each key, the index of its row among them.

    ``stamp`` is scratch int64 space with an entry for every row (its contents do not
    matter).  Each key writes its position into ``stamp[row]``; reading back, exactly one key
    per row finds its own position, which makes it that row's representative.  This is
    linear, where ``np.unique`` sorts.  Rows come out in the order their representatives
    appear.
    """
    xp = _xp_of(rows)
    n = int(rows.shape[0])
    pos = xp.arange(n, dtype=xp.int64)
    stamp[rows] = pos
    rep = stamp[rows]
    first = xp.flatnonzero(rep == pos)
    if first.shape[0] == n:
        return rows, pos
    compact = xp.empty(n, dtype=xp.int64)
    compact[first] = xp.arange(first.shape[0], dtype=xp.int64)
    return rows[first], compact[rep]


def embedding_gradients(
    rows: Any,
    grad_out: Any,
    layout: CsrLayout,
    combiner: str,
    stamp: Any,
) -> tuple[Any, Any]:
    """Backward of :func:`combine` after a gather ``embeddings = table[rows]``.

    ``grad_out`` is the gradient of the loss with respect to the layer output
    (``[batch_size, slot_num, dim]`` or ``[num_rows, dim]``).  Returns ``(unique_rows,
    grads)``: the distinct table rows of the batch and the loss gradient with respect to each
    (``[len(unique_rows), dim]`` float32, summed over every occurrence of the row).
    """
    xp = _xp_of(grad_out)
    dim = int(grad_out.shape[-1])
    g_rows = xp.ascontiguousarray(grad_out, dtype=xp.float32).reshape(layout.num_rows, dim)
    scale = layout.row_scale(combiner)
    if layout.kind == "fixed" and combiner == "mean":
        g_rows = g_rows * (1.0 / layout.width)
    elif scale is not None:
        g_rows = g_rows * scale[:, None]
    if use_kernels(xp, g_rows) and isinstance(rows, np.ndarray):
        # one pass: dedupe through the stamp array and sum each row's gradients
        uniq = np.empty(layout.nnz, dtype=np.int64)
        sums = np.empty((layout.nnz, dim), dtype=g_rows.dtype)
        k = unique_sum(rows, g_rows, layout.row_of_key, stamp, uniq, sums)
        return uniq[:k], sums[:k]
    uniq, inverse = unique_rows(rows, stamp)
    n_unique = int(uniq.shape[0])
    if layout.kind == "one_hot":
        if n_unique == layout.nnz:  # no repeated key: nothing to sum
            return uniq, g_rows
        return uniq, scatter_sum(g_rows, inverse, n_unique)
    if n_unique == layout.nnz:
        return uniq, xp.take(g_rows, layout.row_of_key, axis=0)
    per_key = xp.take(g_rows, layout.row_of_key, axis=0)
    return uniq, scatter_sum(per_key, inverse, n_unique)
