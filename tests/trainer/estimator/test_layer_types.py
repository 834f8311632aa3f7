"""The Estimator's own layer types (Tanh, MeanSquaredErrorLoss, the weighted cross-entropy
losses): backward against central finite differences of forward in float64, and the weighted
losses against plain formulas."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.model.layers import LAYER_TYPES, build_layer

EPS = 1e-6
B = 5


def _layer(kind, bottoms, shapes, **extra):
    layer = build_layer({"name": kind, "type": kind, "bottom": bottoms, "top": kind, **extra})
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
    "MeanSquaredErrorLoss+w+sum": (["x", "y", "w"], [(2,), (2,), (1,)]),
    "WeightedBinaryCrossEntropyLoss": (["x", "y", "w"], [(1,), (1,), (1,)]),
    "WeightedBinaryCrossEntropyLoss+nonzero_weights": (["x", "y", "w"], [(1,), (1,), (1,)]),
    "WeightedBinaryCrossEntropyLoss+sum": (["x", "y"], [(1,), (1,)]),
    "WeightedCrossEntropyLoss": (["x", "y", "w"], [(4,), (1,), (1,)]),
    "WeightedCrossEntropyLoss+weighted_mean": (["x", "y", "w"], [(4,), (1,), (1,)]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_backward_matches_finite_differences(case):
    kind, *rest = case.split("+")
    reduction = [r for r in rest if r != "w"]
    bottoms, shapes = CASES[case]
    assert kind in LAYER_TYPES  # registered for the server too
    extra = {"reduction": reduction[0]} if reduction else {}
    layer = _layer(kind, bottoms, shapes, **extra)
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


@pytest.mark.parametrize("reduction, divide", [
    ("mean", lambda w, n: n),  # SUM_OVER_BATCH_SIZE: the canned estimators' default
    ("sum", lambda w, n: 1.0),  # SUM: the V1 canned estimators', DeepCTR's
    ("nonzero_weights", lambda w, n: np.count_nonzero(w)),  # tf.compat.v1.losses' default
    ("weighted_mean", lambda w, n: w.sum()),  # MEAN
])
def test_reductions_equal_tensorflows_formulas(reduction, divide):
    """``tf.compat.v1.losses.compute_weighted_loss`` (``tensorflow/python/ops/losses/
    losses_impl.py``) and keras' ``compute_weighted_loss`` (``tf_keras/utils/losses_utils.py``,
    ``reduce_weighted_loss``): the weighted per-example losses summed, then divided by the
    number of examples, 1, the number of non-zero weights or the sum of the weights."""
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(B, 1)), rng.integers(0, 2, size=(B, 1)).astype(float)
    w = rng.uniform(0.5, 2, size=(B, 1))
    w[1] = 0.0
    bce = _layer("WeightedBinaryCrossEntropyLoss", ["x", "y", "w"], [(1,), (1,), (1,)],
                 reduction=reduction)
    per = np.logaddexp(0, x) - x * y
    assert float(bce.forward(np, [x, y, w], [], [], False)[0][0]) == pytest.approx(
        float((w * per).sum() / divide(w, B)))
    x2, y2 = rng.normal(size=(B, 2)), rng.normal(size=(B, 2))
    mse = _layer("MeanSquaredErrorLoss", ["x", "y", "w"], [(2,), (2,), (1,)],
                 reduction=reduction)
    wb = np.broadcast_to(w, (B, 2))  # an example's weight covers its label columns
    assert float(mse.forward(np, [x2, y2, w], [], [], False)[0][0]) == pytest.approx(
        float((wb * (x2 - y2) ** 2).sum() / divide(wb, 2 * B)))
    assert mse.predict(np, x) is x  # the served output is the input itself
    with pytest.raises(Exception, match="reduction must be one of"):
        _layer("MeanSquaredErrorLoss", ["x", "y"], [(1,), (1,)], reduction="none")
