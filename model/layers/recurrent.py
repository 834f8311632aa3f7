"""GRU: a single-layer gated recurrent unit over a sequence, initial state zero."""

from __future__ import annotations

from typing import Any

import numpy as np

from .activation import sigmoid
from .base import Layer, Shape, register
from .initializers import initialize, initializer_name


@register
class GRU(Layer):
    """GRU over ``SeqLength`` steps of ``vector_size`` inputs (per sample
    [SeqLength * vector_size]); output every step's state: [SeqLength * num_output].

    cuDNN's equations (as HugeCTR's GRU layer), hidden size H = ``num_output``::

        r = sigmoid(x W_r + b_Wr + h R_r + b_Rr)
        z = sigmoid(x W_z + b_Wz + h R_z + b_Rz)
        n = tanh(x W_n + b_Wn + r * (h R_n + b_Rn))
        h' = (1 - z) * n + z * h

    Parameters (file order): ``W[vector_size, 3H]``, ``R[H, 3H]``, ``b_W[3H]``, ``b_R[3H]``,
    gates in the order r, z, n (tierserve's layout, not cuDNN's packed buffer).  Defaults:
    W and R XavierUniform, biases zero.  ``batchsize`` is accepted and not needed.
    """

    type_name = "GRU"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.hidden = int(self.param("num_output", 1, "gru_param"))
        self.steps = int(self.param("SeqLength", 1, "gru_param"))
        self.width = int(self.param("vector_size", 1, "gru_param"))
        if min(self.hidden, self.steps, self.width) < 1:
            raise self.error("num_output, SeqLength and vector_size must be positive")
        self.weight_init = initializer_name(self.param("weight_init", "Default", "gru_param"))
        self.bias_init = initializer_name(self.param("bias_init", "Default", "gru_param"))

    def infer_shapes(self) -> list[Shape]:
        n = int(np.prod(self.input_shapes[0]))
        if n != self.steps * self.width:
            raise self.error(
                f"input has {n} values per sample; SeqLength * vector_size is "
                f"{self.steps} * {self.width}"
            )
        return [(self.steps * self.hidden,)]

    def param_shapes(self) -> list[Shape]:
        h3 = 3 * self.hidden
        return [(self.width, h3), (self.hidden, h3), (h3,), (h3,)]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        h, h3 = self.hidden, 3 * self.hidden
        return [
            initialize(rng, self.weight_init, (self.width, h3), self.width, h, "XavierUniform"),
            initialize(rng, self.weight_init, (h, h3), h, h, "XavierUniform"),
            initialize(rng, self.bias_init, (h3,), 0, h, "Zero"),
            initialize(rng, self.bias_init, (h3,), 0, h, "Zero"),
        ]

    def forward(self, xp, inputs, params, state, training):
        w, r_w, b_w, b_r = params
        x = inputs[0].reshape(-1, self.steps, self.width)
        b, hh = x.shape[0], self.hidden
        xw = (x.reshape(-1, self.width) @ w + b_w).reshape(b, self.steps, 3 * hh)
        h = xp.zeros((b, hh), dtype=x.dtype)
        out = xp.empty((b, self.steps, hh), dtype=x.dtype)
        saved = []
        for t in range(self.steps):
            hr = h @ r_w + b_r
            r = sigmoid(xp, xw[:, t, :hh] + hr[:, :hh])
            z = sigmoid(xp, xw[:, t, hh : 2 * hh] + hr[:, hh : 2 * hh])
            n = xp.tanh(xw[:, t, 2 * hh :] + r * hr[:, 2 * hh :])
            saved.append((h, r, z, n, hr[:, 2 * hh :]))
            h = (1 - z) * n + z * h
            out[:, t] = h
        return [out.reshape(b, -1)], (x, saved)

    def backward(self, xp, grad_outputs, ctx, params):
        w, r_w, _, _ = params
        x, saved = ctx
        b, hh = x.shape[0], self.hidden
        g = grad_outputs[0].reshape(b, self.steps, hh)
        d_xw = xp.empty((b, self.steps, 3 * hh), dtype=g.dtype)
        d_r = xp.zeros_like(r_w)
        d_br = xp.zeros(3 * hh, dtype=g.dtype)
        dh_next = xp.zeros((b, hh), dtype=g.dtype)
        for t in reversed(range(self.steps)):
            h_prev, r, z, n, hr_n = saved[t]
            dh = g[:, t] + dh_next
            dn = dh * (1 - z) * (1 - n * n)
            dz = dh * (h_prev - n) * z * (1 - z)
            dr = dn * hr_n * r * (1 - r)
            d_xw[:, t, :hh] = dr
            d_xw[:, t, hh : 2 * hh] = dz
            d_xw[:, t, 2 * hh :] = dn
            d_hr = xp.concatenate([dr, dz, dn * r], axis=1)
            d_r += h_prev.T @ d_hr
            d_br += d_hr.sum(axis=0)
            dh_next = dh * z + d_hr @ r_w.T
        flat = d_xw.reshape(-1, 3 * hh)
        d_w = x.reshape(-1, self.width).T @ flat
        d_bw = flat.sum(axis=0)
        dx = (flat @ w.T).reshape(b, *self.input_shapes[0])
        return [dx], [d_w, d_r, d_bw, d_br]
