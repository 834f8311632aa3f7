"""Layer types the Estimator API needs beyond HugeCTR's: ``Tanh``, ``MeanSquaredErrorLoss``,
the cross-entropy losses with example weights and TensorFlow's loss reductions, and those of
the TensorFlow ops a ``model_fn`` uses (:mod:`tierserve.trainer.tf`): ``ArgMax``, ``OneHot``,
``Variable``, ``SoftmaxCrossEntropyLoss``, ``ReduceMeanLoss``.

They implement the trainer's layer contract (:mod:`tierserve.model.layers.base`) and are
registered in its registry, so the inference server builds them from an exported graph like
any other layer (``tierserve.trainer`` imports this module).  ``MeanSquaredErrorLoss``
predicts its input unchanged: an export ends in it over whatever tensor the model serves.
"""

from __future__ import annotations

import numpy as np

from tierserve.model.layers.base import Layer, Shape, register
from tierserve.model.layers.loss import LossLayer


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
        from tierserve.model.layers.activation import sigmoid

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


# -- layer types of the TensorFlow ops (tierserve.trainer.tf) --------------------------------


def _batch_axis(layer: Layer, axis: int, rank: int) -> int:
    """A TensorFlow axis of a ``[batch, *shape]`` tensor (batch = 0, negative from the end)
    as a per-sample axis 1..rank."""
    a = axis + rank + 1 if axis < 0 else axis
    if not 1 <= a <= rank:
        raise layer.error(f"axis {axis} is not a per-example axis of a tensor of shape "
                          f"[batch{''.join(f', {d}' for d in layer.input_shapes[0])}]")
    return a


@register
class ArgMax(Layer):
    """Index of the largest value along ``axis`` (TensorFlow's, batch = 0; default 1), as
    int64; the first on ties, as ``tf.argmax``.  No gradient (indices are not
    differentiable)."""

    type_name = "ArgMax"

    def infer_shapes(self) -> list[Shape]:
        shape = self.input_shapes[0]
        self.axis = _batch_axis(self, int(self.param("axis", 1)), len(shape))
        return [tuple(d for i, d in enumerate(shape) if i != self.axis - 1)]

    def forward(self, xp, inputs, params, state, training):
        return [inputs[0].argmax(axis=self.axis).astype(xp.int64)], None

    def backward(self, xp, grad_outputs, ctx, params):
        return [None], []


@register
class OneHot(Layer):
    """``tf.one_hot``: each index becomes a ``depth``-vector of ``off_value`` with
    ``on_value`` at the index (indices outside ``[0, depth)``: all ``off_value``).  Output
    ``[*input shape, depth]``; ``squeeze_input`` reads a ``[1]``-shaped input (labels given
    as ``[batch]``) as a scalar per example.  No gradient."""

    type_name = "OneHot"

    def infer_shapes(self) -> list[Shape]:
        self.depth = int(self.param("depth", 0))
        if self.depth < 1:
            raise self.error(f"depth must be positive, got {self.depth}")
        self.on = float(self.param("on_value", 1.0))
        self.off = float(self.param("off_value", 0.0))
        shape = self.input_shapes[0]
        if self.param("squeeze_input", False):
            if shape != (1,):
                raise self.error(f"squeeze_input needs a [batch, 1] input, got {list(shape)}")
            shape = ()
        return [(*shape, self.depth)]

    def forward(self, xp, inputs, params, state, training):
        x = inputs[0]
        idx = x.reshape(-1).astype(xp.int64)
        out = xp.full((idx.size, self.depth), self.off, dtype=xp.float32)
        ok = (idx >= 0) & (idx < self.depth)
        out[xp.arange(idx.size)[ok], idx[ok]] = self.on
        return [out.reshape(x.shape[0], *self.output_shapes[0])], None

    def backward(self, xp, grad_outputs, ctx, params):
        return [None], []


@register
class Variable(Layer):
    """A variable (``tf.Variable`` / ``tf.get_variable``) as a tensor: its value, the same
    for every example of the batch.  The bottom only gives the batch size (the dense input);
    the value is the layer's one parameter (``shape``), its gradient the sum over the batch.
    Initial value: the Estimator's (``tf.get_variable``'s default is TensorFlow's Glorot
    uniform, drawn here)."""

    type_name = "Variable"

    def infer_shapes(self) -> list[Shape]:
        self.var_shape = tuple(int(d) for d in self.param("shape", []))
        return [self.var_shape]

    def param_shapes(self) -> list[Shape]:
        return [self.var_shape]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        s = self.var_shape
        fan_in = s[-2] if len(s) > 1 else (s[0] if s else 1)
        fan_out = s[-1] if s else 1
        receptive = int(np.prod(s[:-2])) if len(s) > 2 else 1
        limit = np.sqrt(6.0 / ((fan_in + fan_out) * receptive))
        return [rng.uniform(-limit, limit, size=s).astype(np.float32)]

    def forward(self, xp, inputs, params, state, training):
        b = inputs[0].shape[0]
        return [xp.broadcast_to(params[0], (b, *self.var_shape)).copy()], None

    def backward(self, xp, grad_outputs, ctx, params):
        return [None], [grad_outputs[0].sum(axis=0)]


@register
class SoftmaxCrossEntropyLoss(LossLayer):
    """``tf.losses.softmax_cross_entropy``: softmax and cross entropy against label
    distributions (one-hot or soft) over C classes, logits and labels ``[batch, C]``,
    averaged over the batch; ``label_smoothing`` mixes the labels with the uniform
    distribution as TensorFlow does.  Predicts the softmax."""

    type_name = "SoftmaxCrossEntropyLoss"

    def infer_shapes(self) -> list[Shape]:
        x, y = self.input_shapes
        if x != y or len(x) != 1 or x[0] < 2:
            raise self.error(f"needs logits and labels of one shape [batch, classes >= 2], "
                             f"got {list(x)} and {list(y)}")
        self.smoothing = float(self.param("label_smoothing", 0.0))
        return [(1,)]

    def forward(self, xp, inputs, params, state, training):
        x, y = inputs
        y = y.astype(x.dtype, copy=False)
        if self.smoothing:
            y = y * (1 - self.smoothing) + self.smoothing / x.shape[1]
        shifted = x - x.max(axis=1, keepdims=True)
        logp = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        return [-(y * logp).sum() / x.shape[0]], (logp, y)

    def backward(self, xp, grad_outputs, ctx, params):
        logp, y = ctx
        g = (xp.exp(logp) * y.sum(axis=1, keepdims=True) - y) * (grad_outputs[0] / len(y))
        return [g.astype(logp.dtype, copy=False), None], []

    def predict(self, xp, logits):
        e = xp.exp(logits - logits.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)


@register
class ReduceMeanLoss(LossLayer):
    """``tf.reduce_mean`` over the whole batch: the mean of every value of its input, the
    scalar a ``model_fn`` minimizes (``tf.reduce_mean(per_example_loss)``).  Predicts its
    input unchanged."""

    type_name = "ReduceMeanLoss"
    num_inputs = (1, 1)

    @property
    def label_name(self) -> str | None:
        return None

    def infer_shapes(self) -> list[Shape]:
        return [(1,)]

    def forward(self, xp, inputs, params, state, training):
        x = inputs[0]
        return [x.mean()], (x.shape, x.dtype)

    def backward(self, xp, grad_outputs, ctx, params):
        shape, dtype = ctx
        size = int(np.prod(shape))
        return [xp.full(shape, grad_outputs[0] / size, dtype=dtype)], []

    def predict(self, xp, logits):
        return logits
