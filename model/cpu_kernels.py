"""The trainer's compiled (numba) CPU kernels: the elementwise and gather/scatter work of a
training step around the BLAS matrix products.

Each kernel replaces a sequence of numpy array passes on the CPU path (``xp`` is numpy) with
one loop over the data: fewer passes over memory, no temporaries, no per-call dispatch of a
dozen numpy functions.  The array code stays the reference (and the cupy path); the tests
check each kernel against it.  Kernels take float32 or float64 arrays (the gradient tests
run the layers in float64) and compile once per dtype, cached on disk; :func:`use_kernels`
says whether a set of arrays can take them.

Results equal the array code's up to float rounding: the ReLU and bias kernels and the
AdaGrad updates compute the same float operations in the same order (equal bit for bit);
the interaction and the embedding gradient sums add in another order than ``matmul`` and
``bincount`` (which sums in float64).

Every kernel compiles with ``error_model="numpy"``: numba's default (Python's) checks each
float division for zero, and that branch keeps LLVM from vectorising the loop (AdaGrad ran
5x slower with it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

from tierserve.ps.hash_kernels import prefetch, prefetch_write

#: How many keys ahead the gather/scatter loops prefetch their table rows.
PREFETCH = 16
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def use_kernels(xp: Any, *arrays: Any) -> bool:
    """Whether ``arrays`` (numpy, all float32 or all float64) can go through these kernels."""
    if xp is not np:
        return False
    dtype = arrays[0].dtype
    return dtype in _DTYPES and all(
        isinstance(a, np.ndarray) and a.dtype == dtype for a in arrays)


def flat_views(*arrays: Any) -> list[Any] | None:
    """1-D views of ``arrays`` in memory order when all are C-contiguous or all are
    Fortran-contiguous (so their flat positions match element for element), else None."""
    if all(a.flags.c_contiguous for a in arrays):
        return [a.reshape(-1) for a in arrays]
    if all(a.flags.f_contiguous for a in arrays):
        return [a.T.reshape(-1) for a in arrays]
    return None


# ---- fully connected layers -----------------------------------------------------------------

@njit(nogil=True, cache=True, error_model="numpy")
def bias_act(y, b, relu):
    """``y += b`` then, with ``relu``, ``y = max(y, 0)`` (NaN stays NaN), in place; ``y`` is
    ``[n, m]`` and ``b`` ``[m]``."""
    n, m = y.shape
    for i in range(n):
        row = y[i]
        for j in range(m):
            v = row[j] + b[j]
            if relu and v < 0:
                v = 0
            row[j] = v


@njit(nogil=True, cache=True, error_model="numpy")
def relu_grad_bias(y, g, out, db):
    """``out = where(y > 0, g, 0)`` and ``db = out.sum(axis=0)`` in one pass.  ``out`` may
    be ``g``.  The column sums add row after row, as numpy's ``sum(axis=0)`` does."""
    n, m = g.shape
    for j in range(m):
        db[j] = 0
    for i in range(n):
        yr, gr, orow = y[i], g[i], out[i]
        for j in range(m):
            v = gr[j] if yr[j] > 0 else 0
            orow[j] = v
            db[j] += orow[j]


@njit(nogil=True, cache=True, error_model="numpy")
def relu_grad(y, g, out):
    """``out = where(y > 0, g, 0)`` elementwise over flat (1-D) arrays."""
    for i in range(g.shape[0]):
        out[i] = g[i] if y[i] > 0 else 0


# ---- DLRM dot interaction -------------------------------------------------------------------

#: Samples the interaction forward computes side by side (vector lanes over samples;
#: 16 measured faster than 32 or 64).
LANES = 16


@njit(nogil=True, cache=True, error_model="numpy")
def interaction_forward(x, e, out, lanes):
    """HugeCTR's Interaction output ``[x, tril(Z Z^T, -1), 0]`` with ``Z = [x; e]``.

    ``x`` ``[B, D]``, ``e`` ``[B, S, D]``, ``out`` ``[B, D + n(n-1)/2 + 1]`` (``n = S + 1``).
    ``lanes`` samples at a time (``LANES``) are copied slot-major (``[n, D, lanes]``) so
    that each pair's dot products of all of them are one vector loop over the samples,
    added over ``d`` in order (a per-sample dot product ends in a horizontal sum per pair).
    ``lanes`` is an argument, not a constant: a constant trip count gets the loop unrolled
    into scalar code instead of vectorised.
    """
    batch, dim = x.shape
    n = e.shape[1] + 1
    npairs = n * (n - 1) // 2
    zs = np.zeros((n, dim, lanes), dtype=out.dtype)
    block = np.empty((npairs, lanes), dtype=out.dtype)
    for b0 in range(0, batch, lanes):
        m = min(lanes, batch - b0)
        for k in range(m):
            for d in range(dim):
                zs[0, d, k] = x[b0 + k, d]
            for s in range(n - 1):
                for d in range(dim):
                    zs[s + 1, d, k] = e[b0 + k, s, d]
        p = 0
        for i in range(1, n):
            for j in range(i):
                acc = block[p]
                acc[:] = 0
                for d in range(dim):
                    zi, zj = zs[i, d], zs[j, d]
                    for k in range(lanes):
                        acc[k] += zi[k] * zj[k]
                p += 1
        for k in range(m):
            row = out[b0 + k]
            for d in range(dim):
                row[d] = x[b0 + k, d]
            for q in range(npairs):
                row[dim + q] = block[q, k]
            row[dim + npairs] = 0


@njit(nogil=True, cache=True, error_model="numpy")
def interaction_backward(g, x, e, dx, de):
    """Gradients of :func:`interaction_forward`: ``dx`` ``[B, D]`` and ``de`` ``[B, S, D]``
    from the output gradient ``g``.  With ``G`` the symmetric ``[n, n]`` matrix of the pair
    gradients, ``dZ = G Z``; the first D columns of ``g`` add to ``dx`` directly."""
    batch, dim = x.shape
    n = e.shape[1] + 1
    z = np.empty((n, dim), dtype=dx.dtype)
    dz = np.empty((n, dim), dtype=dx.dtype)
    for b in range(batch):
        for d in range(dim):
            z[0, d] = x[b, d]
        for s in range(n - 1):
            for d in range(dim):
                z[s + 1, d] = e[b, s, d]
        dz[:] = 0
        p = dim
        for i in range(1, n):
            zi, dzi = z[i], dz[i]
            for j in range(i):
                gp = g[b, p + j]
                zj, dzj = z[j], dz[j]
                for d in range(dim):
                    dzi[d] += gp * zj[d]
                    dzj[d] += gp * zi[d]
            p += i
        for d in range(dim):
            dx[b, d] = g[b, d] + dz[0, d]
        for s in range(n - 1):
            for d in range(dim):
                de[b, s, d] = dz[s + 1, d]


# ---- embedding tables -------------------------------------------------------------------------

@njit(nogil=True, cache=True, error_model="numpy")
def index_lookup(keys, home, slots, out):
    """:meth:`~tierserve.trainer.embedding.key_index.KeyIndex.lookup`'s probe in one pass:
    the row of each key, -1 where absent.  ``home`` holds each key's home slot and
    ``slots`` is the index's ``[2**bits, 2]`` (key, row) array, probed linearly (wrapping
    around) until the key or an empty slot (row -1).  The home slot ``PREFETCH`` keys
    ahead is prefetched."""
    n = keys.shape[0]
    mask = slots.shape[0] - 1
    flat = slots.reshape(-1)
    for i in range(n + PREFETCH):
        if i < n:
            prefetch(flat, 2 * home[i])
        j = i - PREFETCH
        if j >= 0:
            key = keys[j]
            pos = home[j]
            while True:
                row = flat[2 * pos + 1]
                if row < 0 or flat[2 * pos] == key:
                    out[j] = row
                    break
                pos = (pos + 1) & mask


@njit(nogil=True, cache=True, error_model="numpy")
def unique_sum(rows, grads, index, stamp, uniq, sums):
    """Distinct ``rows`` and, per distinct row, the sum of ``grads[index[i]]`` over every
    ``i`` with that row; returns how many distinct rows there are.

    ``uniq`` (``[len(rows)]``) gets the distinct rows in first-seen order and ``sums``
    (``[len(rows), dim]``) their sums in the same order (its first entries, as many as the
    return value).  ``stamp`` is int64 scratch with an entry per table row (contents do not
    matter): it maps a row to its place in ``uniq`` during the pass.  Rows of a large table
    are cache misses, so each pass prefetches the stamp entry ``PREFETCH`` keys ahead.
    """
    n = rows.shape[0]
    dim = grads.shape[1]
    for i in range(n):
        if i + PREFETCH < n:
            prefetch_write(stamp, rows[i + PREFETCH])
        stamp[rows[i]] = -1
    k = 0
    for i in range(n):
        if i + PREFETCH < n:
            prefetch_write(stamp, rows[i + PREFETCH])
        r = rows[i]
        c = stamp[r]
        src = grads[index[i]]
        if c < 0:
            stamp[r] = k
            uniq[k] = r
            dst = sums[k]
            for d in range(dim):
                dst[d] = src[d]
            k += 1
        else:
            dst = sums[c]
            for d in range(dim):
                dst[d] += src[d]
    return k


# ---- AdaGrad ----------------------------------------------------------------------------------

@njit(nogil=True, cache=True, error_model="numpy")
def adagrad_flat(p, g, a, lr, eps):
    """AdaGrad on flat arrays, in place: ``a += g*g``, ``p -= g / (sqrt(a) + eps) * lr``
    (numpy's operation order; ``lr`` and ``eps`` of the arrays' dtype)."""
    for i in range(p.shape[0]):
        gi = g[i]
        ai = a[i] + gi * gi
        a[i] = ai
        p[i] -= gi / (np.sqrt(ai) + eps) * lr


@njit(nogil=True, cache=True, error_model="numpy")
def adagrad_rows(values, rows, grads, a, lr, eps):
    """:func:`adagrad_flat` on the table rows ``rows`` (distinct) with gradients ``grads``
    (``[len(rows), dim]``); ``values`` and ``a`` are the table's C-contiguous
    ``[capacity, dim]`` arrays, whose rows are prefetched ``PREFETCH`` rows ahead."""
    dim = values.shape[1]
    flat_values, flat_a = values.reshape(-1), a.reshape(-1)
    n = rows.shape[0]
    for k in range(n):
        if k + PREFETCH < n:
            ahead = rows[k + PREFETCH] * dim
            prefetch_write(flat_values, ahead)
            prefetch_write(flat_a, ahead)
        r = rows[k]
        pr, ar, gr = values[r], a[r], grads[k]
        for d in range(dim):
            gi = gr[d]
            ai = ar[d] + gi * gi
            ar[d] = ai
            pr[d] -= gi / (np.sqrt(ai) + eps) * lr
