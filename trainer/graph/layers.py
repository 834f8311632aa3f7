"""The functional layer API for ``model_fn`` bodies (as ``tf.layers`` / ``tf.nn``).

Every function appends the trainer's own layers to the graph being built and returns a
:class:`~.graph.Tensor`; variables are named as TensorFlow names them (``dense/kernel``,
``dense/bias``, ``batch_normalization/gamma``, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError
from tierserve.trainer.graph.tensors import Tensor, as_tensor, current_graph

_INITIALIZERS = {
    "default": "Default", "glorot_normal": "XavierNorm",
    "xavier_normal": "XavierNorm", "glorot_uniform": "XavierUniform",
    "xavier_uniform": "XavierUniform", "zeros": "Zero", "zero": "Zero", "uniform": "Uniform",
}


def _initializer(value: Any, what: str, default: str) -> tuple[str, Callable | None]:
    """(graph-JSON initializer name, callable or None); None gives ``default``."""
    if value is None:
        return default, None
    if callable(value):
        return "Default", value
    key = getattr(value, "name", value)
    if isinstance(key, str) and key in ("Default", "Uniform", "XavierNorm", "XavierUniform",
                                        "Zero"):
        return key, None
    name = _INITIALIZERS.get(key.lower() if isinstance(key, str) else key)
    if name is None:
        raise ConfigError(f"{what}: unknown initializer {value!r} (a callable(shape) or one of "
                          f"{sorted(k for k in _INITIALIZERS if k)})")
    return name, None


def _activation(x: Tensor, activation: Any, name: str) -> Tensor:
    if activation is None:
        return x
    fn = ACTIVATIONS.get(activation) if isinstance(activation, str) else activation
    if fn is None or not callable(fn):
        raise ConfigError(f"{name}: unknown activation {activation!r} "
                          f"(one of {sorted(ACTIVATIONS)} or a function of this module)")
    return fn(x)


def _unary(kind: str, x: Any, name: str | None, extra: dict | None = None) -> Tensor:
    g = current_graph(kind)
    x = as_tensor(x, kind)
    lname = g.unique(name or kind.lower())
    layer = {"name": lname, "type": kind, "bottom": x.name, "top": lname, **(extra or {})}
    return g.add_layer(layer, [lname], [x.shape])[0]


def relu(x: Any, name: str | None = None) -> Tensor:
    return _unary("ReLU", x, name or "relu")


def sigmoid(x: Any, name: str | None = None) -> Tensor:
    return _unary("Sigmoid", x, name or "sigmoid")


def tanh(x: Any, name: str | None = None) -> Tensor:
    return _unary("Tanh", x, name or "tanh")


def elu(x: Any, name: str | None = None) -> Tensor:
    return _unary("ELU", x, name or "elu", {"elu_param": {"alpha": 1.0}})


def softmax(x: Any, name: str | None = None) -> Tensor:
    return _unary("Softmax", x, name or "softmax")


ACTIVATIONS: dict[str, Callable] = {"relu": relu, "sigmoid": sigmoid, "tanh": tanh, "elu": elu,
                                    "softmax": softmax}


def dense(inputs: Any, units: int, activation: Any = None, use_bias: bool = True,
          kernel_initializer: Any = None, bias_initializer: Any = None,
          trainable: bool = True, name: str | None = None) -> Tensor:
    """Fully connected layer (``InnerProduct``): variables ``<name>/kernel``, ``<name>/bias``.
    Initializers default to TensorFlow's (``tf.layers.dense``, keras ``Dense``): Glorot-uniform
    kernel, zero bias.  ``use_bias=False`` keeps the bias at zero (never trained)."""
    g = current_graph("dense")
    x = as_tensor(inputs, "dense")
    if len(x.shape) != 1:
        x = flatten(x)
    units = int(units)
    if units < 1:
        raise ConfigError(f"dense: units must be positive, got {units}")
    lname = g.unique(name or "dense")
    w_init, w_fn = _initializer(kernel_initializer, f"dense {lname!r} kernel_initializer",
                                "XavierUniform")
    b_init, b_fn = _initializer(bias_initializer, f"dense {lname!r} bias_initializer", "Zero")
    layer = {"name": lname, "type": "InnerProduct", "bottom": x.name, "top": lname,
             "fc_param": {"num_output": units, "weight_init": w_init, "bias_init": b_init}}
    kernel, bias = f"{lname}/kernel", f"{lname}/bias"
    out = g.add_layer(layer, [lname], [(units,)], [kernel, bias])[0]
    if w_fn is not None:
        g.initial[kernel] = w_fn
    if b_fn is not None:
        g.initial[bias] = b_fn
    if not use_bias:
        g.frozen[bias] = np.zeros(units, np.float32)
    if not trainable:
        g.frozen[kernel] = None  # None: keep the initial value
        g.frozen.setdefault(bias, None)
    return _activation(out, activation, f"dense {lname!r}")


def dropout(inputs: Any, rate: float = 0.5, training: bool = False,
            name: str | None = None) -> Tensor:
    """Dropout of ``rate`` while training; the identity otherwise (whatever ``training``
    says, the trainer's Dropout layer knows when it trains)."""
    x = as_tensor(inputs, "dropout")
    if not 0.0 <= float(rate) < 1.0:
        raise ConfigError(f"dropout: rate must lie in [0, 1), got {rate}")
    if float(rate) == 0.0:
        return x
    return _unary("Dropout", x, name or "dropout", {"rate": float(rate)})


def batch_normalization(inputs: Any, momentum: float = 0.99, epsilon: float = 1e-3,
                        training: bool = False, name: str | None = None) -> Tensor:
    """Batch normalization (``BatchNorm``) as TensorFlow's (``tf.layers`` / keras, 2-D input):
    ``<name>/gamma``, ``<name>/beta`` trained; ``<name>/moving_mean``,
    ``<name>/moving_variance`` updated as ``moving * momentum + batch * (1 - momentum)`` with
    the batch's biased variance."""
    g = current_graph("batch_normalization")
    x = as_tensor(inputs, "batch_normalization")
    if not 0.0 <= float(momentum) <= 1.0:
        raise ConfigError(f"batch_normalization: momentum must lie in [0, 1], got {momentum}")
    lname = g.unique(name or "batch_normalization")
    layer = {"name": lname, "type": "BatchNorm", "bottom": x.name, "top": lname,
             "bn_param": {"factor": 1.0 - float(momentum), "eps": float(epsilon),
                          "unbiased_variance": False}}
    out = g.add_layer(layer, [lname], [x.shape], [f"{lname}/gamma", f"{lname}/beta"])[0]
    g.state_names[lname] = [f"{lname}/moving_mean", f"{lname}/moving_variance"]
    return out


def concat(values: Sequence[Any], axis: int = 1, name: str | None = None) -> Tensor:
    """Concatenation of 2-D tensors on their last axis."""
    g = current_graph("concat")
    xs = [as_tensor(v, "concat") for v in values]
    if axis not in (1, -1):
        raise ConfigError(f"concat: only axis 1 (features) is supported, got {axis}")
    xs = [x if len(x.shape) == 1 else flatten(x) for x in xs]
    if len(xs) == 1:
        return xs[0]
    lname = g.unique(name or "concat")
    layer = {"name": lname, "type": "Concat", "bottom": [x.name for x in xs], "top": lname}
    return g.add_layer(layer, [lname], [(sum(x.width for x in xs),)])[0]


def _elementwise(kind: str, values: Sequence[Any], name: str) -> Tensor:
    g = current_graph(kind)
    xs = [as_tensor(v, kind) for v in values]
    try:
        shape = tuple(np.broadcast_shapes(*(x.shape for x in xs)))
    except ValueError:
        raise ConfigError(f"{kind}: input shapes {[x.shape for x in xs]} neither match nor "
                          "broadcast (per example)") from None
    lname = g.unique(name)
    layer = {"name": lname, "type": kind, "bottom": [x.name for x in xs], "top": lname}
    return g.add_layer(layer, [lname], [shape])[0]


def add(values: Sequence[Any], name: str | None = None) -> Tensor:
    """Element-wise sum of tensors of one shape, or of shapes that broadcast per example."""
    return _elementwise("Add", values, name or "add")


def subtract(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x - y`` element-wise (shapes as :func:`add`)."""
    return _elementwise("Sub", [x, y], name or "sub")


def multiply(values: Sequence[Any], name: str | None = None) -> Tensor:
    """Element-wise product of tensors of one shape, or of shapes that broadcast."""
    return _elementwise("ElementwiseMultiply", values, name or "multiply")


def reshape(x: Any, shape: Sequence[int], name: str | None = None) -> Tensor:
    """Per-sample reshape to ``shape`` (leading batch dimension left out, or -1/None)."""
    g = current_graph("reshape")
    x = as_tensor(x, "reshape")
    shape = [int(d) for d in shape]
    if shape and shape[0] in (-1,) and len(shape) > 1:
        shape = shape[1:]
    n = int(np.prod(shape))
    if n != x.width or len(shape) > 2:
        raise ConfigError(f"reshape: {x.shape} cannot become {shape}")
    lname = g.unique(name or "reshape")
    layer = {"name": lname, "type": "Reshape", "bottom": x.name, "top": lname,
             "leading_dim": shape[-1]}
    return g.add_layer(layer, [lname], [tuple(shape)])[0]


def flatten(x: Any, name: str | None = None) -> Tensor:
    x = as_tensor(x, "flatten")
    return x if len(x.shape) == 1 else reshape(x, [x.width], name or "flatten")


def reduce_sum(x: Any, axis: int = 1, name: str | None = None) -> Tensor:
    """Sum over per-sample axis ``axis`` (kept as size 1, then dropped for a 2-D result)."""
    g = current_graph("reduce_sum")
    x = as_tensor(x, "reduce_sum")
    lname = g.unique(name or "reduce_sum")
    shape = list(x.shape)
    shape[axis - 1] = 1
    layer = {"name": lname, "type": "ReduceSum", "bottom": x.name, "top": lname, "axis": axis}
    out = g.add_layer(layer, [lname], [tuple(shape)])[0]
    return flatten(out) if len(shape) > 1 else out


class Dense:
    """``tf.keras.layers.Dense``-style callable: ``Dense(units, activation)(x)``."""

    def __init__(self, units: int, activation: Any = None, use_bias: bool = True,
                 name: str | None = None, **kwargs: Any) -> None:
        self.units, self.activation, self.use_bias, self.name = units, activation, use_bias, name
        self.kwargs = kwargs

    def __call__(self, x: Any) -> Tensor:
        return dense(x, self.units, self.activation, self.use_bias, name=self.name,
                     **self.kwargs)


__all__ = [
    "ACTIVATIONS", "Dense", "add", "batch_normalization", "concat", "dense", "dropout", "elu",
    "flatten", "multiply", "reduce_sum", "relu", "reshape", "sigmoid", "softmax", "subtract",
    "tanh",
]
