"""Feature-interaction layers: DLRM's dot Interaction and the factorisation machine's FmOrder2."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..cpu_kernels import LANES, interaction_backward, interaction_forward, use_kernels
from .base import Layer, Shape, register


@register
class Interaction(Layer):
    """DLRM dot interaction, HugeCTR's output layout.

    Inputs: the bottom MLP output ``x[B, D]`` and the embeddings ``e[B, S, D]``.  With
    ``Z = [x; e]`` ([B, n, D], n = S + 1) the output is ``[x, tril(Z Z^T), 0]``: the D values
    of ``x``, then the n(n-1)/2 dot products below the diagonal, row by row
    ((1,0), (2,0), (2,1), ...), then one zero of padding: width D + n(n-1)/2 + 1.  A second
    top name (HugeCTR's fp16 ``*_grad`` tensor) gets the same output.
    """

    type_name = "Interaction"
    num_inputs = (2, 2)
    num_outputs = (1, 2)

    def infer_shapes(self) -> list[Shape]:
        mlp, emb = self.input_shapes
        self.check_rank(mlp, (2,), "first input (the bottom MLP output)")
        self.check_rank(emb, (3,), "second input (the embeddings)")
        if mlp[0] != emb[1]:
            raise self.error(
                f"the bottom MLP output has width {mlp[0]}, the embeddings {emb[1]}: "
                "they must be equal"
            )
        self.dim = mlp[0]
        self.n = emb[0] + 1
        self.rows, self.cols = np.tril_indices(self.n, -1)
        self.num_pairs = len(self.rows)
        width = self.dim + self.num_pairs + 1
        return [(width,)] * len(self.top)

    def _index(self, xp):
        """Flat positions in a row-major [n, n] block of the pairs (i, j) and (j, i)."""
        cached = getattr(self, "_flat", None)
        if cached is None or cached[0] is not xp:
            lower = self.rows * self.n + self.cols
            upper = self.cols * self.n + self.rows
            self._flat = (xp, xp.asarray(lower), xp.asarray(upper))
        return self._flat[1:]

    def forward(self, xp, inputs, params, state, training):
        x, e = inputs
        b = x.shape[0]
        out = xp.empty((b, self.dim + self.num_pairs + 1), dtype=x.dtype)
        if use_kernels(xp, x, e):
            interaction_forward(x, e, out, LANES)
            return [out] * len(self.top), (x, e)
        lower, _ = self._index(xp)
        z = xp.concatenate([x[:, None, :], e], axis=1)
        zz = xp.matmul(z, z.transpose(0, 2, 1)).reshape(b, self.n * self.n)
        out[:, : self.dim] = x
        out[:, self.dim : -1] = xp.take(zz, lower, axis=1)
        out[:, -1] = 0
        return [out] * len(self.top), (x, e)

    def backward(self, xp, grad_outputs, ctx, params):
        x, e = ctx
        g = grad_outputs[0]
        for extra in grad_outputs[1:]:
            if extra is not None:
                g = extra if g is None else g + extra
        if use_kernels(xp, g, x, e):
            dx, de = np.empty_like(x), np.empty(e.shape, dtype=e.dtype)
            interaction_backward(g, x, e, dx, de)
            return [dx, de], []
        lower, upper = self._index(xp)
        z = xp.concatenate([x[:, None, :], e], axis=1)
        b = z.shape[0]
        pairs = g[:, self.dim : -1]
        # d(z_i . z_j) / dz = z_j for row i and z_i for row j: a symmetric [n, n] weight
        full = xp.zeros((b, self.n * self.n), dtype=g.dtype)
        full[:, lower] = pairs
        full[:, upper] = pairs
        dz = xp.matmul(full.reshape(b, self.n, self.n), z)
        dx = g[:, : self.dim] + dz[:, 0]
        return [dx, dz[:, 1:]], []


@register
class FmOrder2(Layer):
    """Second-order factorisation machine: ``0.5 * ((sum_s v_s)^2 - sum_s v_s^2)``.

    Input [S * out_dim] (or [S, out_dim]); output [out_dim].
    """

    type_name = "FmOrder2"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.out_dim = int(self.param("out_dim", 0))
        if self.out_dim < 1:
            raise self.error(f"out_dim must be positive, got {self.out_dim}")

    def infer_shapes(self) -> list[Shape]:
        n = int(np.prod(self.input_shapes[0]))
        if n % self.out_dim:
            raise self.error(f"{n} values per sample are not slots of out_dim {self.out_dim}")
        return [(self.out_dim,)]

    def forward(self, xp, inputs, params, state, training):
        x = inputs[0]
        v = x.reshape(x.shape[0], -1, self.out_dim)
        s = v.sum(axis=1)
        y = 0.5 * (s * s - (v * v).sum(axis=1))
        return [y.astype(x.dtype, copy=False)], (v, s, x.shape)

    def backward(self, xp, grad_outputs, ctx, params):
        v, s, shape = ctx
        g = grad_outputs[0]
        dv = g[:, None, :] * (s[:, None, :] - v)
        return [dv.reshape(shape)], []
