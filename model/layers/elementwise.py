"""Element-wise combinations and reductions: Add, Sub, ElementwiseMultiply, ReduceSum,
ReduceMean; and the per-sample matrix product MatrixMultiply."""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import Layer, Shape, register


class _SameShape(Layer):
    """Inputs of one per-sample shape (HugeCTR's rule), or shapes that broadcast per sample
    as numpy broadcasts them (aligned on the last axis, the batch axis apart:
    ``tf.Variable(0.1) * x``); a broadcast input's gradient is summed back to its shape."""

    num_inputs = (2, None)

    def infer_shapes(self) -> list[Shape]:
        if len(set(self.input_shapes)) == 1:
            self.broadcast = False
            return [self.input_shapes[0]]
        try:
            out = tuple(np.broadcast_shapes(*self.input_shapes))
        except ValueError:
            raise self.error(f"inputs must have the same shape, or shapes that broadcast per "
                             f"sample, got {self.input_shapes}") from None
        self.broadcast = True
        return [out]

    def aligned(self, inputs: list) -> list:
        """Inputs reshaped to the output's rank (size-1 axes in front, after the batch)."""
        if not self.broadcast:
            return inputs
        rank = len(self.output_shapes[0])
        return [x.reshape(x.shape[0], *([1] * (rank - len(s))), *s)
                for x, s in zip(inputs, self.input_shapes)]

    def reduced(self, grads: list) -> list:
        """Each input's gradient summed over the axes it was broadcast along."""
        if not self.broadcast:
            return grads
        out = []
        for g, s in zip(grads, self.input_shapes):
            full = (g.shape[0], *([1] * (g.ndim - 1 - len(s))), *s)
            axes = tuple(i for i in range(1, g.ndim) if full[i] == 1 and g.shape[i] != 1)
            if axes:
                g = g.sum(axis=axes, keepdims=True)
            out.append(g.reshape(g.shape[0], *s))
        return out


@register
class Add(_SameShape):
    type_name = "Add"

    def forward(self, xp, inputs, params, state, training):
        inputs = self.aligned(inputs)
        y = inputs[0] + inputs[1]
        for x in inputs[2:]:
            y += x
        return [y], None

    def backward(self, xp, grad_outputs, ctx, params):
        g = grad_outputs[0]
        return self.reduced([g] * len(self.bottom)), []


@register
class Sub(_SameShape):
    type_name = "Sub"
    num_inputs = (2, 2)

    def forward(self, xp, inputs, params, state, training):
        a, b = self.aligned(inputs)
        return [a - b], None

    def backward(self, xp, grad_outputs, ctx, params):
        g = grad_outputs[0]
        return self.reduced([g, -g]), []


@register
class ElementwiseMultiply(_SameShape):
    type_name = "ElementwiseMultiply"
    aliases = ("ElementWiseMultiply",)

    def forward(self, xp, inputs, params, state, training):
        inputs = self.aligned(inputs)
        y = inputs[0] * inputs[1]
        for x in inputs[2:]:
            y = y * x
        return [y], inputs

    def backward(self, xp, grad_outputs, ctx, params):
        g = grad_outputs[0]
        out = []
        for i in range(len(ctx)):
            d = g
            for j, x in enumerate(ctx):
                if j != i:
                    d = d * x
            out.append(d)
        return self.reduced(out), []


@register
class ReduceSum(Layer):
    """Sums over ``axis`` (of the whole tensor, batch = 0; default 1), keeping it as size 1."""

    type_name = "ReduceSum"
    mean = False

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.axis = int(self.param("axis", 1))

    def infer_shapes(self) -> list[Shape]:
        shape = self.input_shapes[0]
        if not 1 <= self.axis <= len(shape):
            raise self.error(
                f"axis {self.axis} is not a per-sample axis of a {len(shape) + 1}-D tensor"
            )
        out = list(shape)
        out[self.axis - 1] = 1
        return [tuple(out)]

    def forward(self, xp, inputs, params, state, training):
        x = inputs[0]
        y = x.mean(axis=self.axis, keepdims=True) if self.mean else x.sum(self.axis, keepdims=True)
        return [y], x.shape

    def backward(self, xp, grad_outputs, ctx, params):
        g = grad_outputs[0]
        if self.mean:
            g = g / ctx[self.axis]
        return [xp.broadcast_to(g, ctx).astype(g.dtype, copy=True)], []


@register
class ReduceMean(ReduceSum):
    """Averages over ``axis`` (default 1), keeping it as size 1."""

    type_name = "ReduceMean"
    mean = True


@register
class MatrixMultiply(Layer):
    """HugeCTR's MatrixMultiply (DIN's attention): the per-sample matrix product of two 3-D
    (or 4-D) tensors, ``[B, M, K] x [B, K, N] -> [B, M, N]`` (``[B, H, M, K] x [B, H, K, N]``)."""

    type_name = "MatrixMultiply"
    num_inputs = (2, 2)

    def infer_shapes(self) -> list[Shape]:
        a, b = self.input_shapes
        if len(a) != len(b) or len(a) not in (2, 3):
            raise self.error(f"needs two 3-D or two 4-D inputs (batch first), got {a} and {b}")
        if a[-1] != b[-2] or a[:-2] != b[:-2]:
            raise self.error(f"cannot multiply {a} by {b}: the inner dimensions differ")
        return [(*a[:-1], b[-1])]

    def forward(self, xp, inputs, params, state, training):
        a, b = inputs
        return [xp.matmul(a, b)], (a, b)

    def backward(self, xp, grad_outputs, ctx, params):
        g = grad_outputs[0]
        a, b = ctx
        return [xp.matmul(g, xp.swapaxes(b, -1, -2)), xp.matmul(xp.swapaxes(a, -1, -2), g)], []
