"""BatchNorm, with running statistics kept as non-trainable state."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Layer, Shape, register
from .initializers import initialize, initializer_name


@register
class BatchNorm(Layer):
    """Batch normalisation over every dimension but the last.

    Parameters: ``gamma[N]`` then ``beta[N]`` (defaults one and zero).  Non-trainable state:
    running mean then running variance (start at zero and one), updated after each training
    step as ``running = running * (1 - factor) + batch * factor`` (unbiased batch variance, as
    cuDNN; ``bn_param`` ``"unbiased_variance": false`` takes the biased one, as keras'
    non-fused BatchNormalization does); inference normalises with them.  ``factor`` defaults
    to 1, ``eps`` to 1e-5.
    """

    type_name = "BatchNorm"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.factor = float(self.param("factor", 1.0, "bn_param"))
        self.eps = float(self.param("eps", 1e-5, "bn_param"))
        self.unbiased = bool(self.param("unbiased_variance", True, "bn_param"))
        self.gamma_init = initializer_name(self.param("gamma_init", "Default", "bn_param"))
        self.beta_init = initializer_name(self.param("beta_init", "Default", "bn_param"))

    def infer_shapes(self) -> list[Shape]:
        self.check_rank(self.input_shapes[0], (2, 3))
        return [self.input_shapes[0]]

    @property
    def width(self) -> int:
        return self.input_shapes[0][-1]

    def param_shapes(self) -> list[Shape]:
        return [(self.width,), (self.width,)]

    def state_shapes(self) -> list[Shape]:
        return [(self.width,), (self.width,)]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        n = self.width
        return [
            initialize(rng, self.gamma_init, (n,), n, n, "One"),
            initialize(rng, self.beta_init, (n,), n, n, "Zero"),
        ]

    def init_state(self) -> list[np.ndarray]:
        return [np.zeros(self.width, np.float32), np.ones(self.width, np.float32)]

    def forward(self, xp, inputs, params, state, training):
        x = inputs[0]
        gamma, beta = params
        axes = tuple(range(x.ndim - 1))
        if training:
            mean = x.mean(axis=axes)
            var = x.var(axis=axes)
        else:
            mean, var = state
        inv_std = 1 / xp.sqrt(var + self.eps)
        xh = (x - mean) * inv_std
        y = xh * gamma + beta
        count = x.size // x.shape[-1]
        return [y.astype(x.dtype, copy=False)], (xh, inv_std, mean, var, count)

    def backward(self, xp, grad_outputs, ctx, params):
        xh, inv_std, _, _, _ = ctx
        gamma = params[0]
        g = grad_outputs[0]
        axes = tuple(range(g.ndim - 1))
        dbeta = g.sum(axis=axes)
        dgamma = (g * xh).sum(axis=axes)
        n = g.size // g.shape[-1]
        dx = (gamma * inv_std) * (g - dbeta / n - xh * (dgamma / n))
        return [dx.astype(g.dtype, copy=False)], [dgamma, dbeta]

    def update_state(self, xp, ctx, state):
        _, _, mean, var, count = ctx
        unbiased = var * (count / max(count - 1, 1)) if self.unbiased else var
        running_mean, running_var = state
        running_mean *= 1 - self.factor
        running_mean += self.factor * mean.astype(running_mean.dtype, copy=False)
        running_var *= 1 - self.factor
        running_var += self.factor * unbiased.astype(running_var.dtype, copy=False)
