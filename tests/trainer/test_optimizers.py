"""Optimizers against their formulas, written out independently here in float64."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tierserve.core.errors import InvalidInputError
from tierserve.trainer import optimizers
from tierserve.trainer.optimizers import (
    CreateOptimizer,
    Optimizer_t,
    OptParamsPy,
    Update_t,
    make_optimizer,
)

LR = 0.05
STEPS = 6
DIM = 3


def _grads(shape, steps=STEPS, seed=1):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for _ in range(steps)]


# ---- reference rules: one step, float64, elementwise, fresh state = None ------------------


def ref_adam(w, g, s, t, b1=0.9, b2=0.999, eps=1e-7, lr=LR):
    m, v = s if s is not None else (0.0 * w, 0.0 * w)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    alpha = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
    return w - alpha * m / (np.sqrt(v) + eps), (m, v)


def ref_adagrad(w, g, s, t, init=0.1, eps=1e-7, lr=LR):
    a = s if s is not None else np.full_like(w, init)
    a = a + g * g
    return w - lr * g / (np.sqrt(a) + eps), a


def ref_momentum(w, g, s, t, mu=0.8, lr=LR):
    u = s if s is not None else 0.0 * w
    u = mu * u - lr * g
    return w + u, u


def ref_nesterov(w, g, s, t, mu=0.8, lr=LR):
    u = s if s is not None else 0.0 * w
    u_new = mu * u - lr * g
    return w - mu * u + (1 + mu) * u_new, u_new


def ref_sgd(w, g, s, t, lr=LR):
    return w - lr * g, None


def ref_ftrl(w, g, s, t, l1=0.01, l2=0.02, beta=0.5, lr=LR):
    z, n = s if s is not None else (0.0 * w, 0.0 * w)
    n_new = n + g * g
    z = z + g + (np.sqrt(n) - np.sqrt(n_new)) * w / lr
    w_new = np.where(np.abs(z) > l1,
                     (np.sign(z) * l1 - z) / ((beta + np.sqrt(n_new)) / lr + l2), 0.0)
    return w_new, (z, n_new)


CASES = [
    (dict(optimizer_type=Optimizer_t.Adam), ref_adam),
    (dict(optimizer_type=Optimizer_t.AdaGrad, initial_accu_value=0.1), ref_adagrad),
    (dict(optimizer_type=Optimizer_t.MomentumSGD, momentum_factor=0.8), ref_momentum),
    (dict(optimizer_type=Optimizer_t.Nesterov, momentum_factor=0.8), ref_nesterov),
    (dict(optimizer_type=Optimizer_t.SGD), ref_sgd),
    (dict(optimizer_type=Optimizer_t.Ftrl, lambda1=0.01, lambda2=0.02, beta=0.5), ref_ftrl),
]
IDS = [c[0]["optimizer_type"].value for c in CASES]


@pytest.mark.parametrize(("kwargs", "ref"), CASES, ids=IDS)
def test_dense_update_matches_formula(kwargs, ref):
    opt = make_optimizer(CreateOptimizer(**kwargs))
    w0 = np.random.default_rng(0).standard_normal((4, DIM))
    param = w0.astype(np.float32)
    state = opt.init_state(param.shape)
    w, s = w0, None
    for t, g in enumerate(_grads((4, DIM)), start=1):
        opt.update_dense(param, g.astype(np.float32), state, LR, t)
        w, s = ref(w, g, s, t)
        np.testing.assert_allclose(param, w, rtol=2e-5, atol=2e-6)


# ---- sparse: row 3 is skipped in some steps -----------------------------------------------

ROWS_PER_STEP = [[0, 1, 3], [1, 2], [0, 1], [3], [0, 2, 3], [1]]
CAPACITY = 5  # row 4 is never hit


def _sparse_run(params: OptParamsPy, w0, grads):
    opt = make_optimizer(params)
    values = w0.astype(np.float32)
    state = opt.init_state(values.shape)
    for t, (rows, g) in enumerate(zip(ROWS_PER_STEP, grads), start=1):
        opt.update_sparse(values, np.array(rows), g[rows].astype(np.float32), state, LR, t)
    return values


@pytest.mark.parametrize(("kwargs", "ref"), CASES, ids=IDS)
def test_sparse_local_updates_only_hit_rows(kwargs, ref):
    w0 = np.random.default_rng(2).standard_normal((CAPACITY, DIM))
    grads = _grads((CAPACITY, DIM), seed=3)
    got = _sparse_run(CreateOptimizer(update_type=Update_t.Local, **kwargs), w0, grads)
    for r in range(CAPACITY):
        w, s = w0[r], None
        for t, (rows, g) in enumerate(zip(ROWS_PER_STEP, grads), start=1):
            if r in rows:
                w, s = ref(w, g[r], s, t)  # the global step t, not the row's own count
        np.testing.assert_allclose(got[r], w, rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(got[4], w0[4].astype(np.float32))


@pytest.mark.parametrize("chunk", [2, 1 << 14])
@pytest.mark.parametrize(("kwargs", "ref"), CASES, ids=IDS)
def test_sparse_global_is_dense_update_with_zero_gradients(kwargs, ref, chunk, monkeypatch):
    monkeypatch.setattr(optimizers, "_GLOBAL_CHUNK", chunk)  # also across several chunks
    w0 = np.random.default_rng(4).standard_normal((CAPACITY, DIM))
    grads = _grads((CAPACITY, DIM), seed=5)
    got = _sparse_run(CreateOptimizer(update_type=Update_t.Global, **kwargs), w0, grads)
    moves = kwargs["optimizer_type"] in (
        Optimizer_t.Adam, Optimizer_t.MomentumSGD, Optimizer_t.Nesterov
    )
    for r in range(CAPACITY):
        w, s = w0[r], None
        for t, (rows, g) in enumerate(zip(ROWS_PER_STEP, grads), start=1):
            if r in rows:
                w, s = ref(w, g[r], s, t)
            elif moves:
                w, s = ref(w, 0.0 * g[r], s, t)
        np.testing.assert_allclose(got[r], w, rtol=2e-5, atol=2e-6)


def test_adam_local_global_lazy_differ_on_a_skipped_row():
    w0 = np.random.default_rng(6).standard_normal((CAPACITY, DIM))
    grads = _grads((CAPACITY, DIM), seed=7)
    out = {
        u: _sparse_run(CreateOptimizer(update_type=u), w0, grads)
        for u in (Update_t.Local, Update_t.Global, Update_t.LazyGlobal)
    }
    # row 3 is hit at steps 1, 4, 5 and skipped at 2, 3, 6: all three rules disagree on it
    assert not np.allclose(out[Update_t.Local][3], out[Update_t.Global][3])
    assert not np.allclose(out[Update_t.Local][3], out[Update_t.LazyGlobal][3])
    assert not np.allclose(out[Update_t.Global][3], out[Update_t.LazyGlobal][3])
    # a row never hit moves only under Global (it has no momentum: stays put everywhere)
    for u in out:
        np.testing.assert_array_equal(out[u][4], w0[4].astype(np.float32))


def test_lazy_global_adam_matches_hugectr_formula():
    b1, b2, eps = 0.9, 0.999, 1e-7
    w0 = np.random.default_rng(8).standard_normal((CAPACITY, DIM))
    grads = _grads((CAPACITY, DIM), seed=9)
    got = _sparse_run(CreateOptimizer(update_type=Update_t.LazyGlobal), w0, grads)
    for r in range(CAPACITY):
        w, m, v, prev = w0[r].copy(), np.zeros(DIM), np.zeros(DIM), 1
        for t, (rows, g) in enumerate(zip(ROWS_PER_STEP, grads), start=1):
            if r not in rows:
                continue
            s = t - prev
            alpha = LR / (1 - b1) * math.sqrt(1 - b2**prev) / (1 - b1**prev) * (1 - b1**s)
            w = w - alpha * m / (np.sqrt(v) + eps)
            m = b1**s * m + (1 - b1) * g[r]
            v = b2**s * v + (1 - b2) * g[r] ** 2
            prev = t
        np.testing.assert_allclose(got[r], w, rtol=2e-5, atol=2e-6)


def test_lazy_global_catch_up_is_close_to_global_after_a_gap():
    """The lazy catch-up step approximates the weight steps Global applied meanwhile."""
    params_g = CreateOptimizer(update_type=Update_t.Global, beta2=0.9)
    params_l = CreateOptimizer(update_type=Update_t.LazyGlobal, beta2=0.9)
    w0 = np.zeros((1, DIM), np.float32)
    g = np.ones((1, DIM), np.float32)
    finals = []
    for params in (params_g, params_l):
        opt = make_optimizer(params)
        values = w0.copy()
        state = opt.init_state(values.shape)
        opt.update_sparse(values, np.array([0]), g, state, LR, 1)
        for t in range(2, 30):  # not hit; Global keeps moving it
            opt.update_sparse(values, np.array([], np.int64), g[:0], state, LR, t)
        opt.update_sparse(values, np.array([0]), 0 * g, state, LR, 30)  # lazy catches up
        finals.append(values.copy())
    assert finals[0][0, 0] < -LR and finals[1][0, 0] < -LR
    np.testing.assert_allclose(finals[1], finals[0], rtol=0.35)


def test_global_update_leaves_rows_past_num_rows_alone():
    opt = make_optimizer(CreateOptimizer(optimizer_type=Optimizer_t.MomentumSGD,
                                         momentum_factor=0.5))
    values = np.ones((6, 2), np.float32)
    state = opt.init_state(values.shape)
    opt.update_sparse(values, np.array([0, 1]), np.ones((2, 2), np.float32), state, 1.0, 1,
                      num_rows=3)
    opt.update_sparse(values, np.array([0]), np.ones((1, 2), np.float32), state, 1.0, 2,
                      num_rows=3)
    np.testing.assert_allclose(values[1], [-0.5, -0.5])  # momentum moved it at step 2
    np.testing.assert_array_equal(values[3:], 1.0)


def test_sparse_state_layout_and_counts():
    assert make_optimizer(CreateOptimizer()).state_names == ("m", "v")
    lazy = make_optimizer(CreateOptimizer(update_type="LazyGlobal"))
    st = lazy.init_state((7, 4))
    assert st["prev_time"].shape == (7,) and st["prev_time"].dtype == np.int64
    assert (st["prev_time"] == 1).all()
    assert lazy.num_state_copies == 3
    assert make_optimizer(CreateOptimizer(optimizer_type="SGD")).num_state_copies == 0
    ada = make_optimizer(CreateOptimizer(optimizer_type="Adagrad", initial_accu_value=0.5))
    assert (ada.init_state((2, 2))["accum"] == 0.5).all()


def test_create_optimizer_defaults_and_errors():
    p = CreateOptimizer()
    assert p.optimizer is Optimizer_t.Adam and p.update_type is Update_t.Global
    assert (p.beta1, p.beta2, p.epsilon, p.momentum_factor, p.atomic_update) == (
        0.9, 0.999, 1e-7, 0.0, True)
    assert Optimizer_t.Adagrad is Optimizer_t.AdaGrad
    with pytest.raises(InvalidInputError, match="LazyGlobal"):
        CreateOptimizer(optimizer_type=Optimizer_t.SGD, update_type=Update_t.LazyGlobal)
    with pytest.raises(InvalidInputError, match="optimizer_type"):
        CreateOptimizer(optimizer_type="RMSProp")
    with pytest.raises(InvalidInputError, match="beta1"):
        CreateOptimizer(beta1=1.5)


@pytest.mark.parametrize("kwargs", [c[0] for c in CASES], ids=IDS)
def test_optimizer_json_round_trip(kwargs):
    p = CreateOptimizer(update_type=Update_t.Local, **kwargs)
    assert OptParamsPy.from_dict(p.to_dict()) == p


def test_lazy_global_with_zero_betas_has_no_nan():
    opt = make_optimizer(CreateOptimizer(update_type=Update_t.LazyGlobal, beta1=0.0, beta2=0.0))
    values = np.ones((3, 2), np.float32)
    state = opt.init_state(values.shape)
    for t, rows in enumerate(([0], [0, 1], [1]), start=1):
        opt.update_sparse(values, np.array(rows), np.ones((len(rows), 2), np.float32), state,
                          0.1, t)
    assert np.isfinite(values).all() and np.isfinite(state["m"]).all()


def test_ftrl_initial_accumulator_starts_n_and_stays_out_of_hugectrs_json():
    """HugeCTR's Ftrl starts ``n`` at 0 (its JSON has no accumulator field); TensorFlow's at
    ``initial_accumulator_value`` 0.1, which the Estimator's Ftrl optimizers pass."""
    plain = CreateOptimizer(Optimizer_t.Ftrl)
    assert "initial_accu_value" not in plain.to_dict()["ftrl_hparam"]
    assert make_optimizer(plain).init_state((2, 3))["n"].max() == 0.0
    tf_like = CreateOptimizer(Optimizer_t.Ftrl, initial_accu_value=0.1)
    assert OptParamsPy.from_dict(tf_like.to_dict()) == tf_like
    state = make_optimizer(tf_like).init_state((2, 3))
    assert np.all(state["n"] == np.float32(0.1)) and np.all(state["z"] == 0.0)
