"""Layers with weight matrices: InnerProduct, FusedInnerProduct, MultiCross, WeightMultiply."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..blas import matmul
from ..cpu_kernels import bias_act, relu_grad_bias, use_kernels
from .base import Layer, Shape, register
from .initializers import initialize, initializer_name


def _init_type(layer: Layer, key: str, section: str | None) -> str:
    return initializer_name(layer.param(key, "Default", section))


@register
class InnerProduct(Layer):
    """Fully connected: ``y = x @ W + b`` over the last dimension (2-D or 3-D input).

    Parameters: ``W[in, out]`` then ``b[out]``.  HugeCTR's defaults: W XavierNorm (fan avg),
    b normal(0, sqrt(1/out)) truncated at 2 std; ``Uniform`` draws W from
    +-1/(in + out) and b from +-1/out.
    """

    type_name = "InnerProduct"
    num_inputs = (1, 2)  # a second bottom (HugeCTR's fp16 "*_grad" tensor) is ignored
    activation = "Non"
    # W[in, out] column-major is W^T[out, in] row-major (torch's layout): OpenBLAS runs
    # x @ W, g @ W^T and dW = (g^T x)^T about 7% faster so than on a row-major W.
    column_major_params = (0,)

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.num_output = int(self.param("num_output", 1, "fc_param"))
        if self.num_output < 1:
            raise self.error(f"num_output must be positive, got {self.num_output}")
        self.weight_init = _init_type(self, "weight_init", "fc_param")
        self.bias_init = _init_type(self, "bias_init", "fc_param")

    @property
    def in_dim(self) -> int:
        return self.input_shapes[0][-1]

    def infer_shapes(self) -> list[Shape]:
        self.check_rank(self.input_shapes[0], (2, 3))
        return [(*self.input_shapes[0][:-1], self.num_output)]

    def param_shapes(self) -> list[Shape]:
        return [(self.in_dim, self.num_output), (self.num_output,)]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        fan_in, fan_out = self.in_dim, self.num_output
        w = initialize(rng, self.weight_init, (fan_in, fan_out), fan_in, fan_out, "XavierNorm")
        b = initialize(
            rng, self.bias_init, (fan_out,), 0, fan_out, "BiasNormal", uniform_limit=1 / fan_out
        )
        return [w, b]

    def forward(self, xp, inputs, params, state, training):
        x = inputs[0]
        w, b = params
        x2 = x.reshape(-1, x.shape[-1])
        y = matmul(x2, w)
        relu = self.activation == "Relu"
        if use_kernels(xp, y, b):  # bias and ReLU in one pass
            bias_act(y, b, relu)
        else:
            y += b
            if relu:
                xp.maximum(y, 0, out=y)
        return [y.reshape(*x.shape[:-1], self.num_output)], (x2, y, x.shape)

    def backward(self, xp, grad_outputs, ctx, params):
        x2, y, in_shape = ctx
        w, _ = params
        g = grad_outputs[0].reshape(-1, self.num_output)
        if self.activation == "Relu" and use_kernels(xp, y, g):
            masked = np.empty_like(g)
            db = np.empty(self.num_output, dtype=g.dtype)
            relu_grad_bias(y, g, masked, db)  # the ReLU mask and the bias gradient, one pass
            g = masked
        else:
            if self.activation == "Relu":
                g = xp.where(y > 0, g, 0).astype(g.dtype, copy=False)
            db = g.sum(axis=0)
        # dW in W's layout (column-major W: computed as (g^T x)^T, no transposed copy)
        if w.flags.f_contiguous and not w.flags.c_contiguous:
            dw = matmul(g.T, x2).T
        else:
            dw = matmul(x2.T, g)
        dx = None
        if self.needs_input_grad(0):
            # one output: an outer product, which BLAS runs as a slow rank-1 matrix product
            dx = (g * w[:, 0] if self.num_output == 1 else matmul(g, w.T)).reshape(in_shape)
        grads = [dx] + [None] * (len(self.bottom) - 1)
        return grads, [dw, db]


@register
class FusedInnerProduct(InnerProduct):
    """InnerProduct with a fused ReLU (``activation`` "Relu", the default, or "Non")."""

    type_name = "FusedInnerProduct"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        act = self.param("activation", "Relu")
        act = getattr(act, "name", act)
        if act not in ("Relu", "Non"):
            raise self.error(f"activation must be 'Relu' or 'Non', got {act!r}")
        self.activation = act


@register
class MultiCross(Layer):
    """DCN cross network: ``x_{l+1} = x0 * (x_l . w_l) + b_l + x_l`` for ``num_layers`` layers.

    Parameters per layer: ``w[1, D]`` then ``b[1, D]``.  Defaults: w XavierUniform with
    fan-in = fan-out = D, b zero.
    """

    type_name = "MultiCross"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.num_layers = int(self.param("num_layers", 0, "mc_param"))
        if self.num_layers < 1:
            raise self.error(f"num_layers must be positive, got {self.num_layers}")
        self.weight_init = _init_type(self, "weight_init", "mc_param")
        self.bias_init = _init_type(self, "bias_init", "mc_param")

    def infer_shapes(self) -> list[Shape]:
        self.check_rank(self.input_shapes[0], (2,))
        return [self.input_shapes[0]]

    def param_shapes(self) -> list[Shape]:
        d = self.input_shapes[0][0]
        return [(1, d), (1, d)] * self.num_layers

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        d = self.input_shapes[0][0]
        out = []
        for _ in range(self.num_layers):
            out.append(initialize(rng, self.weight_init, (1, d), d, d, "XavierUniform"))
            out.append(initialize(rng, self.bias_init, (1, d), d, d, "Zero"))
        return out

    def forward(self, xp, inputs, params, state, training):
        x0 = inputs[0]
        x = x0
        xs, ss = [], []
        for i in range(self.num_layers):
            w, b = params[2 * i], params[2 * i + 1]
            s = x @ w.T  # [B, 1]
            xs.append(x)
            ss.append(s)
            x = x0 * s + b + x
        return [x], (x0, xs, ss)

    def backward(self, xp, grad_outputs, ctx, params):
        x0, xs, ss = ctx
        g = grad_outputs[0]
        dx0 = None
        grads: list = [None] * (2 * self.num_layers)
        for i in reversed(range(self.num_layers)):
            w = params[2 * i]
            grads[2 * i + 1] = g.sum(axis=0, keepdims=True)
            ds = (g * x0).sum(axis=1, keepdims=True)  # [B, 1]
            grads[2 * i] = ds.T @ xs[i]
            dx0 = g * ss[i] if dx0 is None else dx0 + g * ss[i]
            g = g + ds @ w
        return [dx0 + g], grads


@register
class WeightMultiply(Layer):
    """``out[b, s*V + v] = x[b, s] * W[s, v]`` with ``weight_dims = [S, V]``.

    Parameter: ``W[S, V]``; default XavierUniform with fan (S, V).
    """

    type_name = "WeightMultiply"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        dims = list(self.param("weight_dims", []))
        if len(dims) != 2 or min(dims) < 1:
            raise self.error(f"weight_dims must be [slot_num, vec_dim], got {dims}")
        self.weight_dims = (int(dims[0]), int(dims[1]))
        self.weight_init = _init_type(self, "weight_init", None)

    def infer_shapes(self) -> list[Shape]:
        shape = self.input_shapes[0]
        n = int(np.prod(shape))
        if n != self.weight_dims[0]:
            raise self.error(
                f"input has {n} values per sample; weight_dims[0] is {self.weight_dims[0]}"
            )
        return [(self.weight_dims[0] * self.weight_dims[1],)]

    def param_shapes(self) -> list[Shape]:
        return [self.weight_dims]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        s, v = self.weight_dims
        return [initialize(rng, self.weight_init, (s, v), s, v, "XavierUniform")]

    def forward(self, xp, inputs, params, state, training):
        x = inputs[0].reshape(inputs[0].shape[0], -1)
        w = params[0]
        y = x[:, :, None] * w[None]
        return [y.reshape(x.shape[0], -1)], (x, inputs[0].shape)

    def backward(self, xp, grad_outputs, ctx, params):
        x, in_shape = ctx
        w = params[0]
        g = grad_outputs[0].reshape(x.shape[0], *self.weight_dims)
        dw = xp.einsum("bs,bsv->sv", x, g)
        dx = (g * w[None]).sum(axis=2).reshape(in_shape)
        return [dx], [dw]
