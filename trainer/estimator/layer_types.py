"""Layer types the Estimator API needs beyond HugeCTR's: ``Tanh``, ``MeanSquaredErrorLoss``
and the cross-entropy losses with example weights and TensorFlow's loss reductions.

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


#: How a loss reduces its weighted per-element losses ``w * l`` (TensorFlow's reductions):
#: ``mean`` divides their sum by the number of elements (``SUM_OVER_BATCH_SIZE``, and the
#: unweighted mean), ``sum`` keeps the sum (``SUM``), ``nonzero_weights`` divides by the number
#: of elements with a non-zero weight (``SUM_BY_NONZERO_WEIGHTS``, ``tf.compat.v1.losses``'
#: default), ``weighted_mean`` by the sum of the weights (``MEAN``).
REDUCTIONS = ("mean", "sum", "nonzero_weights", "weighted_mean")


class ReducedLoss(LossLayer):
    """A loss over per-element losses with optional example weights (third bottom, ``[B, 1]``
    broadcast over the elements of an example) and a ``reduction`` (default ``mean``)."""

    num_inputs = (2, 3)

    def __init__(self, config):
        super().__init__(config)
        self.reduction = str(self.param("reduction", "mean"))
        if self.reduction not in REDUCTIONS:
            raise self.error(f"reduction must be one of {REDUCTIONS}, got {self.reduction!r}")

    def _reduce(self, xp, per, w):
        """``(loss, scale)``: the reduced loss of ``per`` (``[B, k]``) and the factor (array
        or number) each element's loss gradient is multiplied by."""
        wb = None if w is None else xp.broadcast_to(w, per.shape)
        total = float((per if wb is None else wb * per).sum())
        if self.reduction == "sum":
            denom = 1.0
        elif self.reduction == "mean" or wb is None:
            denom = float(per.size)
        elif self.reduction == "nonzero_weights":
            denom = float(xp.count_nonzero(wb))
        else:
            denom = float(wb.sum())
        if denom == 0:  # TensorFlow's safe division: no weight, no loss
            return 0.0, 0.0
        scale = (1.0 / denom) if wb is None else wb / denom
        return total / denom, scale


@register
class MeanSquaredErrorLoss(ReducedLoss):
    """Squared differences of prediction and label over the batch and the label columns,
    reduced by ``reduction``; predicts its input."""

    type_name = "MeanSquaredErrorLoss"

    def infer_shapes(self) -> list[Shape]:
        x, y = self.input_shapes[:2]
        if int(np.prod(x)) != int(np.prod(y)):
            raise self.error(f"predictions {list(x)} and label {list(y)} differ in size")
        return [(1,)]

    def forward(self, xp, inputs, params, state, training):
        x, y = inputs[0], inputs[1]
        n = x.shape[0]
        d = x.reshape(n, -1) - y.reshape(n, -1).astype(x.dtype, copy=False)
        loss, scale = self._reduce(xp, d * d, _weights(xp, inputs, n, x.dtype))
        return [xp.asarray(loss, dtype=x.dtype)], (d, scale, x.shape)

    def backward(self, xp, grad_outputs, ctx, params):
        d, scale, shape = ctx
        g = 2 * d * scale * grad_outputs[0]
        return [g.reshape(shape).astype(d.dtype, copy=False), None, None][: len(self.bottom)], []

    def predict(self, xp, logits):
        return logits


@register
class WeightedBinaryCrossEntropyLoss(ReducedLoss):
    """Sigmoid cross entropy with optional per-example weights (third bottom), reduced by
    ``reduction``.  Exports as ``BinaryCrossEntropyLoss`` (same prediction)."""

    type_name = "WeightedBinaryCrossEntropyLoss"

    def forward(self, xp, inputs, params, state, training):
        x, y = inputs[0], inputs[1]
        n = x.shape[0]
        y = y.reshape(x.shape).astype(x.dtype, copy=False)
        per = xp.maximum(x, 0) - x * y + xp.log1p(xp.exp(-xp.abs(x)))
        loss, scale = self._reduce(xp, per.reshape(n, -1), _weights(xp, inputs, n, x.dtype))
        return [xp.asarray(loss, dtype=x.dtype)], (x, y, scale)

    def backward(self, xp, grad_outputs, ctx, params):
        from ..layers.activation import sigmoid

        x, y, scale = ctx
        n = x.shape[0]
        g = ((sigmoid(xp, x) - y).reshape(n, -1) * scale * grad_outputs[0]).reshape(x.shape)
        return [g.astype(x.dtype, copy=False), None, None][: len(self.bottom)], []


@register
class WeightedCrossEntropyLoss(ReducedLoss):
    """Softmax cross entropy (label = class index) with optional per-example weights (third
    bottom), reduced by ``reduction``.  Exports as ``CrossEntropyLoss``."""

    type_name = "WeightedCrossEntropyLoss"

    def _softmax(self, xp, x):
        e = xp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def forward(self, xp, inputs, params, state, training):
        x, y = inputs[0], inputs[1]
        n = x.shape[0]
        idx = y.reshape(-1).astype(np.int64)
        shifted = x - x.max(axis=1, keepdims=True)
        logp = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        per = -logp[xp.arange(n), idx].reshape(n, 1)
        loss, scale = self._reduce(xp, per, _weights(xp, inputs, n, x.dtype))
        return [xp.asarray(loss, dtype=x.dtype)], (x, idx, scale)

    def backward(self, xp, grad_outputs, ctx, params):
        x, idx, scale = ctx
        p = self._softmax(xp, x)
        p[xp.arange(x.shape[0]), idx] -= 1
        g = p * (scale * grad_outputs[0])
        return [g.astype(x.dtype, copy=False), None, None][: len(self.bottom)], []

    def predict(self, xp, logits):
        return self._softmax(xp, logits)


#: Training-only loss types and what an export writes instead (same prediction).
EXPORT_LOSS = {
    "WeightedBinaryCrossEntropyLoss": "BinaryCrossEntropyLoss",
    "WeightedCrossEntropyLoss": "CrossEntropyLoss",
}
