"""Layer types the Estimator API needs beyond HugeCTR's: ``Tanh``, ``MeanSquaredErrorLoss``
and example-weighted cross-entropy losses.

They implement the trainer's layer contract (:mod:`tierserve.trainer.layers.base`) and are
registered in its registry, so the inference server builds them from an exported graph like
any other layer (``tierserve.trainer`` imports this module).  ``MeanSquaredErrorLoss``
predicts its input unchanged: an export ends in it over whatever tensor the model serves.
"""

from __future__ import annotations

import numpy as np

from ..layers.base import Layer, Shape, register
from ..layers.loss import LossLayer


@register
class Tanh(Layer):
    """Hyperbolic tangent."""

    type_name = "Tanh"

    def forward(self, xp, inputs, params, state, training):
        y = xp.tanh(inputs[0])
        return [y], y

    def backward(self, xp, grad_outputs, ctx, params):
        return [grad_outputs[0] * (1 - ctx * ctx)], []


def _weights(xp, inputs, n, dtype):
    if len(inputs) < 3:
        return None
    return inputs[2].reshape(n, -1).astype(dtype, copy=False)


@register
class MeanSquaredErrorLoss(LossLayer):
    """Mean of ``w * (prediction - label)^2`` over the batch and the label columns, divided
    by the mean weight when an example-weight tensor is the third bottom; predicts its input."""

    type_name = "MeanSquaredErrorLoss"
    num_inputs = (2, 3)

    def infer_shapes(self) -> list[Shape]:
        x, y = self.input_shapes[:2]
        if int(np.prod(x)) != int(np.prod(y)):
            raise self.error(f"predictions {list(x)} and label {list(y)} differ in size")
        return [(1,)]

    def forward(self, xp, inputs, params, state, training):
        x, y = inputs[0], inputs[1]
        n = x.shape[0]
        d = x.reshape(n, -1) - y.reshape(n, -1).astype(x.dtype, copy=False)
        w = _weights(xp, inputs, n, x.dtype)
        if w is None:
            return [(d * d).mean()], (d, None, x.shape)
        return [(w * d * d).mean() / max(float(w.mean()), 1e-12)], (d, w, x.shape)

    def backward(self, xp, grad_outputs, ctx, params):
        d, w, shape = ctx
        g = 2 * d * (grad_outputs[0] / d.size)
        if w is not None:
            g = g * w / max(float(w.mean()), 1e-12)
        return [g.reshape(shape).astype(d.dtype, copy=False), None, None][: len(self.bottom)], []

    def predict(self, xp, logits):
        return logits


@register
class WeightedBinaryCrossEntropyLoss(LossLayer):
    """``BinaryCrossEntropyLoss`` with per-example weights (third bottom): the weighted mean.
    Exports as ``BinaryCrossEntropyLoss`` (the weights change training, not predictions)."""

    type_name = "WeightedBinaryCrossEntropyLoss"
    num_inputs = (3, 3)

    def forward(self, xp, inputs, params, state, training):
        x, y = inputs[0], inputs[1]
        n = x.shape[0]
        y = y.reshape(x.shape).astype(x.dtype, copy=False)
        w = xp.broadcast_to(_weights(xp, inputs, n, x.dtype), x.shape)
        norm = max(float(w.sum()), 1e-12)
        loss = xp.maximum(x, 0) - x * y + xp.log1p(xp.exp(-xp.abs(x)))
        return [(w * loss).sum() / norm], (x, y, w, norm)

    def backward(self, xp, grad_outputs, ctx, params):
        from ..layers.activation import sigmoid

        x, y, w, norm = ctx
        g = (sigmoid(xp, x) - y) * w * (grad_outputs[0] / norm)
        return [g.astype(x.dtype, copy=False), None, None], []


@register
class WeightedCrossEntropyLoss(LossLayer):
    """Softmax cross entropy with per-example weights (third bottom); label = class index.
    Exports as ``CrossEntropyLoss``."""

    type_name = "WeightedCrossEntropyLoss"
    num_inputs = (3, 3)

    def _softmax(self, xp, x):
        e = xp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def forward(self, xp, inputs, params, state, training):
        x, y = inputs[0], inputs[1]
        n = x.shape[0]
        idx = y.reshape(-1).astype(np.int64)
        w = _weights(xp, inputs, n, x.dtype).reshape(-1)
        norm = max(float(w.sum()), 1e-12)
        shifted = x - x.max(axis=1, keepdims=True)
        logp = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        loss = -(w * logp[xp.arange(n), idx]).sum() / norm
        return [loss], (x, idx, w, norm)

    def backward(self, xp, grad_outputs, ctx, params):
        x, idx, w, norm = ctx
        p = self._softmax(xp, x)
        p[xp.arange(x.shape[0]), idx] -= 1
        g = p * (w[:, None] * (grad_outputs[0] / norm))
        return [g.astype(x.dtype, copy=False), None, None], []

    def predict(self, xp, logits):
        return self._softmax(xp, logits)


#: Training-only loss types and what an export writes instead (same prediction).
EXPORT_LOSS = {
    "WeightedBinaryCrossEntropyLoss": "BinaryCrossEntropyLoss",
    "WeightedCrossEntropyLoss": "CrossEntropyLoss",
}
