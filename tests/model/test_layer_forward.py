"""Forward passes of the non-trivial layers against straightforward numpy references."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.core.errors import ConfigError
from tierserve.model.layers import build_layer


def _layer(config, shapes, tops=1):
    layer = build_layer(
        {"name": "l", "bottom": [f"in{i}" for i in range(len(shapes))],
         "top": [f"out{i}" for i in range(tops)], **config}
    )
    layer.build(shapes)
    return layer


def test_interaction_matches_loops_and_hugectr_width():
    rng = np.random.default_rng(0)
    b, s, d = 4, 26, 8
    layer = _layer({"type": "Interaction"}, [(d,), (s, d)])
    n = s + 1
    assert layer.output_shapes == [(d + n * (n - 1) // 2 + 1,)]  # DLRM 26 slots, d=128: 480
    x = rng.normal(size=(b, d)).astype(np.float32)
    e = rng.normal(size=(b, s, d)).astype(np.float32)
    (out,), _ = layer.forward(np, [x, e], [], [], True)
    for k in range(b):
        z = np.vstack([x[k], e[k]])
        want = [*x[k]]
        for i in range(1, n):
            for j in range(i):
                want.append(z[i] @ z[j])
        want.append(0.0)
        np.testing.assert_allclose(out[k], want, rtol=1e-5, atol=1e-5)


def test_dlrm_interaction_width_is_480():
    layer = _layer({"type": "Interaction"}, [(128,), (26, 128)], tops=2)
    assert layer.output_shapes == [(480,), (480,)]


def test_multicross_matches_loop():
    rng = np.random.default_rng(1)
    b, d, layers = 5, 6, 3
    layer = _layer({"type": "MultiCross", "mc_param": {"num_layers": layers}}, [(d,)])
    params = [rng.normal(size=s) for s in layer.param_shapes()]
    x0 = rng.normal(size=(b, d))
    (out,), _ = layer.forward(np, [x0], params, [], True)
    for k in range(b):
        x = x0[k]
        for i in range(layers):
            w, bias = params[2 * i][0], params[2 * i + 1][0]
            x = x0[k] * (x @ w) + bias + x
        np.testing.assert_allclose(out[k], x, rtol=1e-10)


def test_fm_order2_matches_pairwise_sum():
    rng = np.random.default_rng(2)
    b, s, k = 3, 5, 4
    layer = _layer({"type": "FmOrder2", "out_dim": k}, [(s * k,)])
    x = rng.normal(size=(b, s * k))
    (out,), _ = layer.forward(np, [x], [], [], True)
    v = x.reshape(b, s, k)
    want = np.zeros((b, k))
    for i in range(s):
        for j in range(i + 1, s):
            want += v[:, i] * v[:, j]
    np.testing.assert_allclose(out, want, rtol=1e-10)


def test_batchnorm_training_inference_and_running_stats():
    rng = np.random.default_rng(3)
    layer = _layer({"type": "BatchNorm", "bn_param": {"factor": 0.25, "eps": 1e-3}}, [(3,)])
    gamma, beta = rng.normal(size=3), rng.normal(size=3)
    state = layer.init_state()
    np.testing.assert_array_equal(state[0], 0)
    np.testing.assert_array_equal(state[1], 1)
    x = rng.normal(2.0, 3.0, size=(50, 3))
    (y,), ctx = layer.forward(np, [x], [gamma, beta], state, True)
    want = (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-3) * gamma + beta
    np.testing.assert_allclose(y, want, rtol=1e-10)
    layer.update_state(np, ctx, state)
    np.testing.assert_allclose(state[0], 0.25 * x.mean(0), rtol=1e-6)
    np.testing.assert_allclose(state[1], 0.75 + 0.25 * x.var(0, ddof=1), rtol=1e-6)
    (y_inf,), _ = layer.forward(np, [x[:2]], [gamma, beta], state, False)
    want_inf = (x[:2] - state[0]) / np.sqrt(state[1] + 1e-3) * gamma + beta
    np.testing.assert_allclose(y_inf, want_inf, rtol=1e-6)


def test_dropout_is_identity_in_inference_and_scales_in_training():
    layer = _layer({"type": "Dropout", "rate": 0.5}, [(1000,)])
    x = np.ones((4, 1000), np.float32)
    (y,), _ = layer.forward(np, [x], [], [], False)
    assert y is x
    (y,), _ = layer.forward(np, [x], [], [], True)
    assert set(np.unique(y)) <= {0.0, 2.0}
    assert 0.4 < (y == 0).mean() < 0.6


def test_initializers_follow_hugectr_defaults():
    rng = np.random.default_rng(4)
    fc = _layer({"type": "InnerProduct", "fc_param": {"num_output": 400}}, [(600,)])
    w, b = fc.init_params(rng)
    assert w.dtype == np.float32 and w.shape == (600, 400) and b.shape == (400,)
    assert abs(w.std() - np.sqrt(2 / 1000)) < 0.1 * np.sqrt(2 / 1000)  # Xavier normal
    assert np.abs(b).max() <= 2 * np.sqrt(1 / 400) + 1e-6
    fc = _layer(
        {"type": "InnerProduct",
         "fc_param": {"num_output": 10, "weight_init": "Uniform", "bias_init": "Zero"}},
        [(30,)],
    )
    w, b = fc.init_params(rng)
    assert np.abs(w).max() <= 1 / 40 and not b.any()
    fc = _layer(
        {"type": "InnerProduct", "fc_param": {"num_output": 10, "weight_init": "XavierUniform"}},
        [(30,)],
    )
    w, _ = fc.init_params(rng)
    assert np.abs(w).max() <= np.sqrt(6 / 40) + 1e-6
    bn = _layer({"type": "BatchNorm"}, [(5,)])
    gamma, beta = bn.init_params(rng)
    assert (gamma == 1).all() and (beta == 0).all()
    mc = _layer({"type": "MultiCross", "mc_param": {"num_layers": 2}}, [(8,)])
    w0, b0, w1, b1 = mc.init_params(rng)
    assert w0.shape == (1, 8) and not b0.any() and not b1.any()


@pytest.mark.parametrize(
    "config,shapes,message",
    [
        ({"type": "Interaction"}, [(4,), (3, 5)], "must be equal"),
        ({"type": "Reshape", "leading_dim": 5}, [(12,)], "does not divide"),
        ({"type": "Slice", "ranges": [[0, 9]]}, [(4,)], "not inside"),
        ({"type": "Concat"}, [(3,), (2, 3)], "be 2-D or all 3-D"),
        ({"type": "Add"}, [(3,), (4,)], "same shape"),
        ({"type": "WeightMultiply", "weight_dims": [3, 2]}, [(4,)], "weight_dims"),
    ],
)
def test_bad_shapes_name_the_layer(config, shapes, message):
    with pytest.raises(ConfigError, match=message) as info:
        _layer(config, shapes)
    assert "'l'" in str(info.value)


def test_unknown_layer_type_is_named():
    with pytest.raises(ConfigError, match="unsupported layer type 'Nope'"):
        build_layer({"name": "x", "type": "Nope", "bottom": "a", "top": "b"})


def test_gru_matches_the_cudnn_equations():
    rng = np.random.default_rng(5)
    steps, width, hidden = 3, 2, 4
    layer = _layer({"type": "GRU", "gru_param": {"num_output": hidden, "SeqLength": steps,
                                                 "vector_size": width}}, [(steps * width,)])
    w, r, bw, br = [rng.normal(size=s) for s in layer.param_shapes()]
    x = rng.normal(size=(2, steps * width))
    (out,), _ = layer.forward(np, [x], [w, r, bw, br], [], True)

    def sig(v):
        return 1 / (1 + np.exp(-v))

    def gate(m, k):
        return m[..., k * hidden : (k + 1) * hidden]

    for s in range(2):
        h = np.zeros(hidden)
        for t in range(steps):
            xt = x[s, t * width : (t + 1) * width]
            rg = sig(xt @ gate(w, 0) + gate(bw, 0) + h @ gate(r, 0) + gate(br, 0))
            zg = sig(xt @ gate(w, 1) + gate(bw, 1) + h @ gate(r, 1) + gate(br, 1))
            ng = np.tanh(xt @ gate(w, 2) + gate(bw, 2) + rg * (h @ gate(r, 2) + gate(br, 2)))
            h = (1 - zg) * ng + zg * h
            np.testing.assert_allclose(out[s, t * hidden : (t + 1) * hidden], h, rtol=1e-10)


def test_slice_and_dropout_follow_hugectr_code_where_its_prose_differs():
    """Issue 13 (README, HugeCTR compatibility): Slice (2, 8) is elements 2..7, six of them,
    as HugeCTR's code slices; dropout_rate is the drop probability and 1 is refused."""
    layer = _layer({"type": "Slice", "ranges": [[2, 8], [0, 3]]}, [(10,)], tops=2)
    x = np.arange(20, dtype=np.float32).reshape(2, 10)
    (a, b), _ = layer.forward(np, [x], [], [], False)
    np.testing.assert_array_equal(a, x[:, 2:8])
    assert a.shape == (2, 6) and b.shape == (2, 3)
    with pytest.raises(ConfigError, match="probability of dropping"):
        _layer({"type": "Dropout", "rate": 1.0}, [(10,)])
