"""The Estimator's own layer types (Tanh, MeanSquaredErrorLoss, the weighted cross-entropy
losses): backward against central finite differences of forward in float64, and the weighted
losses against plain formulas."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.model.layers import LAYER_TYPES, build_layer

EPS = 1e-6
B = 5


def _layer(kind, bottoms, shapes):
    layer = build_layer({"name": kind, "type": kind, "bottom": bottoms, "top": kind})
    layer.build(shapes)
    return layer


def _numeric(f, x):
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        keep = x[idx]
        x[idx] = keep + EPS
        up = f()
        x[idx] = keep - EPS
        down = f()
        x[idx] = keep
        g[idx] = (up - down) / (2 * EPS)
    return g


CASES = {
    "Tanh": (["x"], [(3,)]),
    "MeanSquaredErrorLoss": (["x", "y"], [(2,), (2,)]),
    "MeanSquaredErrorLoss+w": (["x", "y", "w"], [(2,), (2,), (1,)]),
    "WeightedBinaryCrossEntropyLoss": (["x", "y", "w"], [(1,), (1,), (1,)]),
    "WeightedCrossEntropyLoss": (["x", "y", "w"], [(4,), (1,), (1,)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_backward_matches_finite_differences(case):
    kind = case.split("+")[0]
    bottoms, shapes = CASES[case]
    assert kind in LAYER_TYPES  # registered for the server too
    layer = _layer(kind, bottoms, shapes)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(B, *shapes[0]))
    inputs = [x]
    if len(shapes) > 1:
        y = (rng.integers(0, 4, size=(B, 1)) if kind == "WeightedCrossEntropyLoss"
             else rng.integers(0, 2, size=(B, *shapes[1]))).astype(float)
        inputs.append(y)
    if len(shapes) > 2:
        inputs.append(rng.uniform(0.5, 2.0, size=(B, 1)))
    weights = rng.normal(size=(B, *shapes[0])) if not layer.is_loss else 1.0

    def objective():
        out, _ = layer.forward(np, inputs, [], [], True)
        return float(np.sum(out[0] * weights))

    out, ctx = layer.forward(np, inputs, [], [], True)
    grad_out = [1.0] if layer.is_loss else [weights]
    grads, _ = layer.backward(np, grad_out, ctx, [])
    np.testing.assert_allclose(grads[0], _numeric(objective, x), rtol=1e-6, atol=1e-9)


def test_weighted_losses_equal_their_formulas():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(B, 1)), rng.integers(0, 2, size=(B, 1)).astype(float)
    w = rng.uniform(0.5, 2, size=(B, 1))
    bce = _layer("WeightedBinaryCrossEntropyLoss", ["x", "y", "w"], [(1,), (1,), (1,)])
    per = np.logaddexp(0, x) - x * y
    assert float(bce.forward(np, [x, y, w], [], [], False)[0][0]) == pytest.approx(
        float((w * per).sum() / w.sum()))
    mse = _layer("MeanSquaredErrorLoss", ["x", "y", "w"], [(1,), (1,), (1,)])
    assert float(mse.forward(np, [x, y, w], [], [], False)[0][0]) == pytest.approx(
        float((w * (x - y) ** 2).mean() / w.mean()))
    assert mse.predict(np, x) is x  # the served output is the input itself
