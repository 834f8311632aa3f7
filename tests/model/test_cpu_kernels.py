"""The trainer's compiled CPU kernels against the straightforward numpy code they replace."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.model import cpu_kernels as K
from tierserve.model.combine import CsrLayout, embedding_gradients
from tierserve.trainer.optimizers import CreateOptimizer, make_optimizer

DTYPES = [np.float32, np.float64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("relu", [True, False])
def test_bias_act_equals_numpy(dtype, relu):
    rng = np.random.default_rng(1)
    y = rng.normal(size=(37, 19)).astype(dtype)
    y[3, 4] = np.nan
    b = rng.normal(size=19).astype(dtype)
    want = y + b
    if relu:
        want = np.maximum(want, 0)
    got = y.copy()
    K.bias_act(got, b, relu)
    np.testing.assert_array_equal(got, want)  # NaN stays NaN, bit for bit otherwise


@pytest.mark.parametrize("dtype", DTYPES)
def test_relu_grad_bias_equals_numpy(dtype):
    rng = np.random.default_rng(2)
    y = np.maximum(rng.normal(size=(41, 23)), 0).astype(dtype)
    g = rng.normal(size=(41, 23)).astype(dtype)
    want = np.where(y > 0, g, 0).astype(dtype)
    out, db = np.empty_like(g), np.empty(23, dtype=dtype)
    K.relu_grad_bias(y, g, out, db)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(db, want.sum(axis=0))
    flat = np.empty(g.size, dtype=dtype)
    K.relu_grad(y.reshape(-1), g.reshape(-1), flat)
    np.testing.assert_array_equal(flat.reshape(g.shape), want)


def _interaction_reference(x, e):
    z = np.concatenate([x[:, None, :], e], axis=1)
    rows, cols = np.tril_indices(z.shape[1], -1)
    pairs = np.matmul(z, z.transpose(0, 2, 1))[:, rows, cols]
    return np.concatenate([x, pairs, np.zeros((x.shape[0], 1), x.dtype)], axis=1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,slots,dim", [(1, 1, 1), (17, 3, 5), (33, 26, 16), (16, 7, 9)])
def test_interaction_kernels_equal_matmul(dtype, batch, slots, dim):
    rng = np.random.default_rng(batch * 100 + slots)
    x = rng.normal(size=(batch, dim)).astype(dtype)
    e = rng.normal(size=(batch, slots, dim)).astype(dtype)
    n = slots + 1
    out = np.full((batch, dim + n * (n - 1) // 2 + 1), np.nan, dtype=dtype)
    K.interaction_forward(x, e, out, K.LANES)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out, _interaction_reference(x, e), rtol=tol, atol=tol)

    g = rng.normal(size=out.shape).astype(dtype)
    rows, cols = np.tril_indices(n, -1)
    weight = np.zeros((batch, n, n), dtype=dtype)
    weight[:, rows, cols] = g[:, dim:-1]
    weight[:, cols, rows] = g[:, dim:-1]
    z = np.concatenate([x[:, None, :], e], axis=1)
    dz = np.matmul(weight, z)
    dx, de = np.empty_like(x), np.empty_like(e)
    K.interaction_backward(g, x, e, dx, de)
    np.testing.assert_allclose(dx, g[:, :dim] + dz[:, 0], rtol=tol, atol=tol)
    np.testing.assert_allclose(de, dz[:, 1:], rtol=tol, atol=tol)


def test_interaction_kernels_take_strided_inputs():
    """A view (the embedding output of a wider tensor) gives what its copy gives."""
    rng = np.random.default_rng(5)
    wide = rng.normal(size=(20, 6, 8)).astype(np.float32)
    e = wide[:, 1:5, :]  # not contiguous
    x = rng.normal(size=(20, 8)).astype(np.float32)
    out, want = np.empty((20, 8 + 10 + 1), np.float32), np.empty((20, 8 + 10 + 1), np.float32)
    K.interaction_forward(x, e, out, K.LANES)
    K.interaction_forward(x, np.ascontiguousarray(e), want, K.LANES)
    np.testing.assert_array_equal(out, want)


def _unique_sum_reference(rows, grads):
    uniq, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    sums = np.zeros((len(uniq), grads.shape[1]), np.float64)
    np.add.at(sums, inverse, grads)
    order = np.argsort(first)  # first-seen order
    return uniq[order], sums[order]


@pytest.mark.parametrize("n,table", [(0, 10), (1, 10), (500, 40), (500, 100_000)])
def test_unique_sum_equals_unique_and_add_at(n, table):
    rng = np.random.default_rng(n + table)
    rows = rng.integers(0, table, size=n).astype(np.int64)
    grads = rng.normal(size=(n, 4)).astype(np.float32)
    stamp = rng.integers(-5, 5, size=table).astype(np.int64)  # leftover contents
    uniq, sums = np.empty(n, np.int64), np.empty((n, 4), np.float32)
    k = K.unique_sum(rows, grads, np.arange(n), stamp, uniq, sums)
    want_rows, want_sums = _unique_sum_reference(rows, grads)
    assert k == len(want_rows)
    np.testing.assert_array_equal(uniq[:k], want_rows)
    np.testing.assert_allclose(sums[:k], want_sums, rtol=1e-5, atol=1e-5)


def test_embedding_gradients_sum_every_occurrence_of_a_row():
    """The kernel path of embedding_gradients (numpy) against the bincount path's result,
    for one-hot, fixed-width and ragged CSR batches with repeated rows and the mean."""
    rng = np.random.default_rng(9)
    for offsets, combiner in (([0, 1, 2, 3, 4], "sum"), ([0, 2, 4, 6], "mean"),
                              ([0, 1, 1, 4, 6], "mean"), ([0, 3, 3, 5], "sum")):
        offsets = np.asarray(offsets, np.int64)
        nnz, nrows = int(offsets[-1]), len(offsets) - 1
        rows = rng.integers(0, 3, size=nnz).astype(np.int64)
        grad = rng.normal(size=(nrows, 2)).astype(np.float32)
        layout = CsrLayout(offsets, nnz)
        uniq, sums = embedding_gradients(rows, grad, layout, combiner,
                                         np.zeros(3, np.int64))
        counts = np.maximum(np.diff(offsets), 1)
        scale = 1.0 / counts if combiner == "mean" else np.ones(nrows)
        per_key = (grad * scale[:, None])[np.repeat(np.arange(nrows), np.diff(offsets))]
        want_rows, want_sums = _unique_sum_reference(rows, per_key)
        np.testing.assert_array_equal(uniq, want_rows)
        np.testing.assert_allclose(sums, want_sums, rtol=1e-6, atol=1e-6)


def _adagrad_numpy(p, g, a, lr, eps):
    """The array code of AdaGrad (optimizers.AdaGrad) for float32."""
    tmp = g * g
    a += tmp
    tmp = np.sqrt(a)
    tmp += eps
    tmp = g / tmp
    tmp *= lr
    p -= tmp


def test_adagrad_kernels_equal_the_array_code_bit_for_bit():
    rng = np.random.default_rng(3)
    p = rng.normal(size=(50, 8)).astype(np.float32)
    a = rng.random(size=(50, 8)).astype(np.float32)
    g = rng.normal(size=(50, 8)).astype(np.float32)
    want_p, want_a = p.copy(), a.copy()
    _adagrad_numpy(want_p, g, want_a, 0.01, 1e-7)
    got_p, got_a = p.copy(), a.copy()
    K.adagrad_flat(got_p.reshape(-1), g.reshape(-1), got_a.reshape(-1), np.float32(0.01),
                   np.float32(1e-7))
    np.testing.assert_array_equal(got_p, want_p)
    np.testing.assert_array_equal(got_a, want_a)

    rows = np.array([7, 0, 49, 3], np.int64)
    want_p, want_a = p.copy(), a.copy()
    sub_p, sub_a = want_p[rows], want_a[rows]
    _adagrad_numpy(sub_p, g[:4], sub_a, 0.01, 1e-7)
    want_p[rows], want_a[rows] = sub_p, sub_a
    got_p, got_a = p.copy(), a.copy()
    K.adagrad_rows(got_p, rows, g[:4], got_a, np.float32(0.01), np.float32(1e-7))
    np.testing.assert_array_equal(got_p, want_p)
    np.testing.assert_array_equal(got_a, want_a)


@pytest.mark.parametrize("order", ["C", "F"])
def test_adagrad_dense_update_in_either_memory_order(order):
    """The optimizer's dense update on column-major weights (as the model stores fully
    connected weights) equals the update of the same values row-major."""
    opt = make_optimizer(CreateOptimizer("AdaGrad", epsilon=1e-7, initial_accu_value=0.1))
    rng = np.random.default_rng(4)
    p0 = rng.normal(size=(13, 6)).astype(np.float32)
    g = rng.normal(size=(13, 6)).astype(np.float32)
    p = np.array(p0, order=order)
    state = {k: np.array(v, order=order) for k, v in opt.init_state(p.shape).items()}
    opt.update_dense(p, np.array(g, order=order), state, 0.05, 1)
    want_p, want_a = p0.copy(), np.full_like(p0, 0.1)
    _adagrad_numpy(want_p, g, want_a, 0.05, 1e-7)
    np.testing.assert_array_equal(p, want_p)
    np.testing.assert_array_equal(state["accum"], want_a)
    # mixed layouts take the array code, with the same result
    p = p0.copy(order="F")
    state = opt.init_state(p.shape)
    opt.update_dense(p, g, state, 0.05, 1)
    np.testing.assert_array_equal(p, want_p)


def test_flat_views_only_for_matching_layouts():
    c, f = np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32, order="F")
    assert [v.base is not None for v in K.flat_views(c, c)] == [True, True]
    views = K.flat_views(f, f)
    views[0][1] = 5.0  # memory order: the second element of a column-major array is [1, 0]
    assert f[1, 0] == 5.0
    assert K.flat_views(c, f) is None
    assert K.use_kernels(np, c, f) and not K.use_kernels(np, c, c.astype(np.float16))
