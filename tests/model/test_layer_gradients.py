"""Every layer's backward against central finite differences of its forward, in float64."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierserve.model.layers import build_layer

from .layer_cases import CASES, layer_config, num_tops

EPS = 1e-6


def _inputs(layer, rng, batch):
    xs = []
    for i, shape in enumerate(layer.input_shapes):
        if layer.is_loss and i == 1:
            if layer.type_name == "CrossEntropyLoss":
                x = rng.integers(0, layer.input_shapes[0][0], size=(batch, *shape)).astype(float)
            else:
                x = rng.integers(0, 2, size=(batch, *shape)).astype(float)
        else:
            x = rng.normal(size=(batch, *shape))
            # keep away from the kinks of ReLU-like functions
            x = np.where(x >= 0, x + 0.05, x - 0.05)
        xs.append(x)
    return xs


def _objective(layer, inputs, params, state, weights):
    if hasattr(layer, "set_seed"):
        layer.set_seed(7)  # the same dropout mask every time
    outs, _ = layer.forward(np, inputs, params, state, True)
    return sum(float(np.sum(o * w)) for o, w in zip(outs, weights))


def _numeric(f, array):
    grad = np.zeros_like(array)
    flat, gflat = array.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        keep = flat[i]
        flat[i] = keep + EPS
        up = f()
        flat[i] = keep - EPS
        down = f()
        flat[i] = keep
        gflat[i] = (up - down) / (2 * EPS)
    return grad


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize(
    "case_id,config,shapes", [pytest.param(*c, id=c[0]) for c in CASES]
)
def test_backward_matches_finite_differences(case_id, config, shapes, batch):
    if case_id in ("BatchNorm", "PReLU_Dice") and batch == 1:
        pytest.skip("batch statistics of one sample have zero variance")
    rng = np.random.default_rng(zlib.crc32(case_id.encode()))
    layer = build_layer(layer_config(case_id, config, len(shapes), num_tops(config)))
    out_shapes = layer.build(shapes)
    params = [p.astype(np.float64) + rng.normal(scale=0.3, size=p.shape)
              for p in layer.init_params(rng)]
    state = [s.astype(np.float64) for s in layer.init_state()]
    inputs = _inputs(layer, rng, batch)
    if layer.is_loss:
        weights = [np.float64(1.7)]
    else:
        weights = [rng.normal(size=(batch, *s)) for s in out_shapes]

    if hasattr(layer, "set_seed"):
        layer.set_seed(7)
    outs, ctx = layer.forward(np, inputs, params, state, True)
    for o, s in zip(outs, out_shapes):
        if not layer.is_loss:
            assert o.shape == (batch, *s)
    grad_in, grad_params = layer.backward(np, weights, ctx, params)
    assert len(grad_in) == len(inputs)
    assert len(grad_params) == len(params)

    def f():
        return _objective(layer, inputs, params, state, weights)

    for i, x in enumerate(inputs):
        if layer.is_loss and i == 1:
            assert grad_in[i] is None
            continue
        num = _numeric(f, x)
        np.testing.assert_allclose(grad_in[i], num, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{case_id}: input {i}")
    for j, p in enumerate(params):
        num = _numeric(f, p)
        assert grad_params[j].shape == p.shape
        np.testing.assert_allclose(grad_params[j], num, rtol=1e-5, atol=1e-6,
                                   err_msg=f"{case_id}: param {j}")


def test_regularizer_settings_are_read():
    layer = build_layer(
        {"name": "loss", "type": "BinaryCrossEntropyLoss", "bottom": ["a", "b"], "top": "loss",
         "regularizer": "L2", "lambda": 0.25}
    )
    assert (layer.regularizer, layer.reg_lambda) == ("L2", 0.25)


def _check_layer(config, shapes, batch, seed):
    rng = np.random.default_rng(seed)
    layer = build_layer(layer_config("h", config, len(shapes)))
    out_shapes = layer.build(shapes)
    params = [p.astype(np.float64) for p in layer.init_params(rng)]
    inputs = [rng.normal(size=(batch, *s)) for s in shapes]
    weights = [rng.normal(size=(batch, *s)) for s in out_shapes]
    _, ctx = layer.forward(np, inputs, params, [], True)
    grad_in, grad_params = layer.backward(np, weights, ctx, params)

    def f():
        return _objective(layer, inputs, params, [], weights)

    for got, x in zip([*grad_in, *grad_params], [*inputs, *params]):
        np.testing.assert_allclose(got, _numeric(f, x), rtol=1e-5, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 4), st.integers(0, 2**31))
def test_interaction_gradients_any_shape(batch, slots, dim, seed):
    _check_layer({"type": "Interaction"}, [(dim,), (slots, dim)], batch, seed)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(1, 3), st.integers(0, 2**31))
def test_multicross_gradients_any_shape(batch, width, num_layers, seed):
    _check_layer({"type": "MultiCross", "mc_param": {"num_layers": num_layers}}, [(width,)],
                 batch, seed)


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 4), st.integers(1, 5), st.integers(1, 4), st.integers(0, 2**31))
def test_fm_order2_gradients_any_shape(batch, slots, dim, seed):
    _check_layer({"type": "FmOrder2", "out_dim": dim}, [(slots * dim,)], batch, seed)
