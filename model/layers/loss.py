"""Loss layers: BinaryCrossEntropyLoss, CrossEntropyLoss, MultiCrossEntropyLoss.

Each takes ``[logits, label]`` and makes one scalar (the batch mean).  The sigmoid or
softmax is fused in, as in HugeCTR; :meth:`LossLayer.predict` gives the probabilities the
inference graph returns instead of the loss.  The regularizer settings (``regularizer`` "L1"
or "L2", ``lambda``) are read here and applied by the model over all dense parameters.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .activation import sigmoid
from .base import Layer, Shape, register


class LossLayer(Layer):
    num_inputs = (2, 2)
    is_loss = True

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        reg = self.param("regularizer", None)
        reg = getattr(reg, "name", reg)
        if reg not in (None, "None", "L1", "L2"):
            raise self.error(f"regularizer must be 'L1' or 'L2', got {reg!r}")
        self.regularizer = None if reg in (None, "None") else reg
        self.reg_lambda = float(self.param("lambda", 0.0))

    @property
    def label_name(self) -> str:
        return self.bottom[1]

    def infer_shapes(self) -> list[Shape]:
        return [(1,)]

    def predict(self, xp, logits):
        return sigmoid(xp, logits)


@register
class BinaryCrossEntropyLoss(LossLayer):
    """Sigmoid + binary cross entropy; logits and labels [B, k] (k usually 1)."""

    type_name = "BinaryCrossEntropyLoss"

    def infer_shapes(self) -> list[Shape]:
        logits, label = self.input_shapes
        if int(np.prod(logits)) != int(np.prod(label)):
            raise self.error(f"logits {list(logits)} and label {list(label)} differ in size")
        return [(1,)]

    def forward(self, xp, inputs, params, state, training):
        x, y = inputs
        y = y.reshape(x.shape).astype(x.dtype, copy=False)
        loss = xp.maximum(x, 0) - x * y + xp.log1p(xp.exp(-xp.abs(x)))
        return [loss.mean()], (x, y)

    def backward(self, xp, grad_outputs, ctx, params):
        x, y = ctx
        scale = grad_outputs[0] / x.size
        return [((sigmoid(xp, x) - y) * scale).astype(x.dtype, copy=False), None], []


@register
class MultiCrossEntropyLoss(LossLayer):
    """Per-column binary cross entropy weighted by ``target_weight`` (default all ones),
    averaged over the batch and the columns."""

    type_name = "MultiCrossEntropyLoss"

    def infer_shapes(self) -> list[Shape]:
        logits, label = self.input_shapes
        if logits != label:
            raise self.error(f"logits {list(logits)} and label {list(label)} differ in shape")
        k = logits[-1]
        weights = self.param("target_weight", None) or self.param("target_weight_vec", None)
        weights = list(weights) if weights else [1.0] * k
        if len(weights) != k:
            raise self.error(f"target_weight has {len(weights)} values for {k} labels")
        self.weights = np.asarray(weights, np.float32)
        return [(1,)]

    def forward(self, xp, inputs, params, state, training):
        x, y = inputs
        y = y.astype(x.dtype, copy=False)
        w = xp.asarray(self.weights, dtype=x.dtype)
        loss = (xp.maximum(x, 0) - x * y + xp.log1p(xp.exp(-xp.abs(x)))) * w
        return [loss.mean()], (x, y, w)

    def backward(self, xp, grad_outputs, ctx, params):
        x, y, w = ctx
        scale = grad_outputs[0] / x.size
        return [((sigmoid(xp, x) - y) * w * scale).astype(x.dtype, copy=False), None], []


@register
class CrossEntropyLoss(LossLayer):
    """Softmax + cross entropy over C classes; the label holds the class index.

    The label input may be ``[B, label_dim]`` with any ``label_dim`` (HugeCTR checks only the
    logits' width): sample ``i``'s class is the ``i``-th label value in row-major order, the one
    HugeCTR's kernel reads (``label[i]``); with ``label_dim`` 1 that is the sample's own label.
    """

    type_name = "CrossEntropyLoss"

    def infer_shapes(self) -> list[Shape]:
        logits, label = self.input_shapes
        if len(logits) != 1 or logits[0] < 2 or len(label) != 1 or label[0] < 1:
            raise self.error(
                f"needs logits [batch, classes >= 2] and label [batch, label_dim], got "
                f"{list(logits)} and {list(label)}"
            )
        return [(1,)]

    @staticmethod
    def _classes(y, batch: int):
        """Sample ``i``'s class: the ``i``-th label value (row-major), as HugeCTR reads it."""
        return y.reshape(-1)[:batch].astype(np.int64)

    def _softmax(self, xp, x):
        e = xp.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def forward(self, xp, inputs, params, state, training):
        x, y = inputs
        idx = self._classes(y, x.shape[0])
        shifted = x - x.max(axis=1, keepdims=True)
        logp = shifted - xp.log(xp.exp(shifted).sum(axis=1, keepdims=True))
        loss = -logp[xp.arange(x.shape[0]), idx].mean()
        return [loss], (x, idx)

    def backward(self, xp, grad_outputs, ctx, params):
        x, idx = ctx
        p = self._softmax(xp, x)
        p[xp.arange(x.shape[0]), idx] -= 1
        return [(p * (grad_outputs[0] / x.shape[0])).astype(x.dtype, copy=False), None], []

    def predict(self, xp, logits):
        return self._softmax(xp, logits)
