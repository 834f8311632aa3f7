"""Element-wise activations and Dropout: ReLU, ELU, Sigmoid, PReLU_Dice, Softmax, Dropout, Cast."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cpu_kernels import relu_grad, use_kernels
from .base import Layer, register


def sigmoid(xp, x):
    """Numerically stable logistic function."""
    e = xp.exp(-xp.abs(x))
    return xp.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype, copy=False)


@register
class ReLU(Layer):
    type_name = "ReLU"

    def forward(self, xp, inputs, params, state, training):
        y = xp.maximum(inputs[0], 0)
        return [y], y

    def backward(self, xp, grad_outputs, ctx, params):
        g = grad_outputs[0]
        if use_kernels(xp, ctx, g):
            g = np.ascontiguousarray(g)
            out = np.empty_like(g)
            relu_grad(np.ascontiguousarray(ctx).reshape(-1), g.reshape(-1), out.reshape(-1))
            return [out], []
        return [xp.where(ctx > 0, g, 0).astype(g.dtype, copy=False)], []


@register
class ELU(Layer):
    """``x`` for x > 0, else ``alpha * (exp(x) - 1)`` (``elu_param.alpha``, default 1)."""

    type_name = "ELU"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.alpha = float(self.param("alpha", 1.0, "elu_param"))

    def forward(self, xp, inputs, params, state, training):
        x = inputs[0]
        neg = self.alpha * (xp.exp(xp.minimum(x, 0)) - 1)
        return [xp.where(x > 0, x, neg).astype(x.dtype, copy=False)], (x, neg)

    def backward(self, xp, grad_outputs, ctx, params):
        x, neg = ctx
        g = grad_outputs[0]
        return [xp.where(x > 0, g, g * (neg + self.alpha)).astype(g.dtype, copy=False)], []


@register
class Sigmoid(Layer):
    type_name = "Sigmoid"

    def forward(self, xp, inputs, params, state, training):
        y = sigmoid(xp, inputs[0])
        return [y], y

    def backward(self, xp, grad_outputs, ctx, params):
        return [grad_outputs[0] * ctx * (1 - ctx)], []


@register
class Softmax(Layer):
    """Softmax over the last dimension."""

    type_name = "Softmax"

    def forward(self, xp, inputs, params, state, training):
        x = inputs[0]
        e = xp.exp(x - x.max(axis=-1, keepdims=True))
        y = e / e.sum(axis=-1, keepdims=True)
        return [y], y

    def backward(self, xp, grad_outputs, ctx, params):
        g = grad_outputs[0]
        return [ctx * (g - (g * ctx).sum(axis=-1, keepdims=True))], []


@register
class PReLU_Dice(Layer):
    """Dice activation (DIN): ``y = x * (alpha + (1 - alpha) * p)``, ``p = sigmoid(x_hat)``.

    ``x_hat`` is ``x`` normalised with the batch's per-feature mean and (biased) variance
    plus ``eps``, in training and inference alike (as HugeCTR).  ``alpha``: the layer's
    ``elu_alpha`` setting; ``eps`` its ``eps``.
    """

    type_name = "PReLU_Dice"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.alpha = float(self.param("alpha", self.param("elu_alpha", 0.25), "prelu_dice_param"))
        self.eps = float(self.param("eps", 1e-8, "prelu_dice_param"))

    def forward(self, xp, inputs, params, state, training):
        x = inputs[0]
        axes = tuple(range(x.ndim - 1))
        mean = x.mean(axis=axes, keepdims=True)
        inv_std = 1 / xp.sqrt(x.var(axis=axes, keepdims=True) + self.eps)
        xh = (x - mean) * inv_std
        p = sigmoid(xp, xh)
        y = x * (self.alpha + (1 - self.alpha) * p)
        return [y.astype(x.dtype, copy=False)], (x, xh, p, inv_std)

    def backward(self, xp, grad_outputs, ctx, params):
        x, xh, p, inv_std = ctx
        g = grad_outputs[0]
        axes = tuple(range(x.ndim - 1))
        direct = g * (self.alpha + (1 - self.alpha) * p)
        g_xh = g * x * (1 - self.alpha) * p * (1 - p)
        through_norm = inv_std * (
            g_xh - g_xh.mean(axis=axes, keepdims=True)
            - xh * (g_xh * xh).mean(axis=axes, keepdims=True)
        )
        return [(direct + through_norm).astype(g.dtype, copy=False)], []


@register
class Dropout(Layer):
    """Inverted dropout: in training, zero each value with probability ``rate`` and scale
    the rest by 1/(1 - rate); identity in inference.  ``rate`` defaults to 0.5.

    As HugeCTR's code computes it (``scale_ = 1 / (1 - rate)``, ``out = in * (mask >= rate) *
    scale``), ``rate`` is the probability of dropping; its document's "1 means no element is
    dropped" is not what HugeCTR does, and 1 is refused as HugeCTR's code asserts ``rate < 1``.
    """

    type_name = "Dropout"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.rate = float(self.param("rate", self.param("dropout_rate", 0.5)))
        if not 0.0 <= self.rate < 1.0:
            raise self.error(
                f"dropout_rate must be in [0, 1), got {self.rate}: it is the probability of "
                "dropping a value, as in HugeCTR's code (1 would drop every value; use 0, or "
                "no Dropout layer, to keep them all)"
            )
        self._seed = 0
        self._rngs: dict[Any, Any] = {}

    def set_seed(self, seed: int) -> None:
        self._seed = int(seed)
        self._rngs.clear()

    def _rng(self, xp):
        rng = self._rngs.get(xp)
        if rng is None:
            rng = self._rngs[xp] = xp.random.default_rng(self._seed)
        return rng

    def forward(self, xp, inputs, params, state, training):
        x = inputs[0]
        if not training or self.rate == 0.0:
            return [x], None
        keep = self._rng(xp).random(x.shape, dtype=np.float32) >= self.rate
        mask = keep.astype(x.dtype) * x.dtype.type(1.0 / (1.0 - self.rate))
        return [x * mask], mask

    def backward(self, xp, grad_outputs, ctx, params):
        g = grad_outputs[0]
        return [g if ctx is None else g * ctx], []


@register
class Cast(Layer):
    """Without ``dtype``: identity on values (the model's compute dtype decides the
    precision).  With ``dtype`` (``tf.cast``): an integer type truncates toward zero and a
    bool is ``x != 0`` (neither has a gradient, as in TensorFlow); a float type keeps the
    values and passes the gradient."""

    type_name = "Cast"
    _INTEGER = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.dtype = self.param("dtype", None)
        if self.dtype not in (None, "bool", "float16", "float32", "float64", *self._INTEGER):
            raise self.error(f"unsupported dtype {self.dtype!r}")

    def forward(self, xp, inputs, params, state, training):
        x = inputs[0]
        if self.dtype in self._INTEGER:
            return [xp.trunc(x).astype(self.dtype)], None
        if self.dtype == "bool":
            return [x != 0], None
        return [x], None

    def backward(self, xp, grad_outputs, ctx, params):
        if self.dtype in self._INTEGER or self.dtype == "bool":
            return [None], []
        return [grad_outputs[0]], []
