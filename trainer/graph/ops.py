"""TensorFlow's tensor ops for ``model_fn`` bodies: ``argmax``, ``one_hot``, ``cast``,
``reduce_mean`` / ``reduce_sum``, ``reshape``, ``expand_dims``, ``squeeze``, indexing with
``newaxis``, arithmetic with broadcasting, ``constant``.

Each op appends one of the trainer's layers to the graph the ``model_fn`` builds
(:mod:`tierserve.trainer.graph.tensors`), and that layer's forward and backward are what
training runs and the server serves: ``ArgMax``, ``OneHot``, ``Cast``, ``ReduceMean`` /
``ReduceSum``, ``Reshape``, ``Slice``, ``Add`` / ``Sub`` / ``ElementwiseMultiply``,
``Variable``, ``ReduceMeanLoss``.  Axes are TensorFlow's: axis 0 is the batch, which no op
here reduces, except ``reduce_mean`` over everything, which is the loss a ``model_fn``
minimizes (a scalar over the batch is a loss here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError
from tierserve.trainer.graph.losses import Loss
from tierserve.trainer.graph.tensors import DENSE, LabelTensor, Tensor, as_tensor, current_graph

from . import layers as _layers
from .dtypes import as_dtype

newaxis = None
"""``tf.newaxis``: ``t[:, tf.newaxis]`` adds an axis of size 1."""


def _add(kind: str, inputs: list[Tensor], name: str, shape: tuple, extra: dict | None = None,
         params: list[str] | None = None, dtype: str = "float32") -> Tensor:
    g = current_graph(kind)
    lname = g.unique(name)
    bottom: Any = [x.name for x in inputs]
    layer = {"name": lname, "type": kind, "bottom": bottom[0] if len(bottom) == 1 else bottom,
             "top": lname, **(extra or {})}
    out = g.add_layer(layer, [lname], [shape], params)[0]
    out.dtype = dtype
    return out


def _shape_of(x: Tensor) -> tuple[int, ...]:
    """The per-example shape TensorFlow would see (labels given as ``[batch]``: ``()``)."""
    return x.tf_shape if isinstance(x, LabelTensor) else x.shape


def _reshaped(x: Tensor, shape: tuple[int, ...], name: str) -> Tensor:
    if x.shape == shape and not isinstance(x, LabelTensor):
        return x
    out = _add("Reshape", [x], name, shape, {"shape": list(shape)})
    out.dtype = x.dtype
    return out


def _per_example_axes(x: Tensor, axis: Any, op: str) -> list[int]:
    """TensorFlow axes (batch = 0) as per-example axes 1..rank; the batch axis refused."""
    rank = len(_shape_of(x))
    axes = [axis] if isinstance(axis, (int, np.integer)) else list(axis)
    out = []
    for a in axes:
        a = int(a)
        b = a + rank + 1 if a < 0 else a
        if b == 0:
            raise ConfigError(f"{op}: axis {a} is the batch axis; reducing or indexing across "
                              "examples is not supported here (per-example axes 1.."
                              f"{rank})")
        if not 1 <= b <= rank:
            raise ConfigError(f"{op}: axis {a} is outside a tensor of shape [batch"
                              f"{''.join(f', {d}' for d in _shape_of(x))}]")
        out.append(b)
    return sorted(set(out))


# -- values ---------------------------------------------------------------------------------


def constant(value: Any, dtype: Any = None, shape: Any = None, name: str | None = None
             ) -> Tensor:
    """A constant the same for every example (a ``Variable`` layer that never trains)."""
    g = current_graph("constant")
    arr = np.asarray(value, dtype=np.float32)
    if shape is not None:
        arr = np.broadcast_to(arr, tuple(int(d) for d in shape))
    lname = g.unique(name or "Const")
    out = _add("Variable", [dense_input(g)], lname, tuple(arr.shape),
               {"shape": list(arr.shape)}, [lname])
    g.frozen[lname] = arr.copy()
    if dtype is not None:
        out.dtype = as_dtype(dtype).name
    return out


def dense_input(g) -> Tensor:
    """The dense-input tensor every program has (a ``Variable`` layer reads only its batch
    size)."""
    return Tensor(g, DENSE, (g.dense_width,))


def _operand(x: Any, op: str) -> Tensor | Loss:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, (int, float, np.integer, np.floating, np.ndarray, list)):
        return constant(x)
    return as_tensor(x, op)


# -- arithmetic -----------------------------------------------------------------------------


def add(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x + y`` (numbers become constants; shapes broadcast per example)."""
    if isinstance(x, Loss) or isinstance(y, Loss):
        return _loss_combination(x, y, 1.0, "add")
    return _layers.add([_operand(x, "add"), _operand(y, "add")], name=name)


def subtract(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x - y`` (as :func:`add`)."""
    if isinstance(x, Loss) or isinstance(y, Loss):
        return _loss_combination(x, y, -1.0, "subtract")
    return _layers.subtract(_operand(x, "subtract"), _operand(y, "subtract"), name=name)


def multiply(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x * y`` (as :func:`add`); a loss times a number is a weighted loss."""
    if isinstance(x, Loss) or isinstance(y, Loss):
        loss, factor = (x, y) if isinstance(x, Loss) else (y, x)
        return loss * factor
    return _layers.multiply([_operand(x, "multiply"), _operand(y, "multiply")], name=name)


def divide(x: Any, y: Any, name: str | None = None) -> Tensor:
    """``x / y`` for a number ``y`` (a multiplication by ``1 / y``)."""
    if not isinstance(y, (int, float, np.integer, np.floating)):
        raise ConfigError("divide: only division by a number is supported (x / 2.0); to "
                          "divide by a tensor, multiply by its inverse computed in the "
                          "input_fn")
    return multiply(x, 1.0 / float(y), name=name)


truediv = divide


def _loss_combination(x: Any, y: Any, sign: float, op: str) -> Loss:
    if not (isinstance(x, Loss) and isinstance(y, Loss)):
        raise ConfigError(f"{op}: a loss combines only with another loss (loss_a + 0.5 * "
                          "loss_b); add numbers to the tensors before the loss")
    return x + y * sign


# -- per-example ops ------------------------------------------------------------------------


def argmax(input: Any, axis: Any = None, name: str | None = None, dimension: Any = None,
           output_type: Any = "int64") -> Tensor:
    """Index of the largest value along ``axis`` (int64, first on ties)."""
    x = as_tensor(input, "argmax")
    axis = dimension if axis is None else axis
    if axis is None:
        axis = 0  # TensorFlow's default: the batch axis, refused below by name
    (a,) = _per_example_axes(x, int(axis), "argmax")
    shape = tuple(d for i, d in enumerate(x.shape) if i != a - 1)
    return _add("ArgMax", [x], name or "ArgMax", shape, {"axis": a},
                dtype=as_dtype(output_type).name)


arg_max = argmax


def one_hot(indices: Any, depth: int, on_value: Any = None, off_value: Any = None,
            axis: Any = None, dtype: Any = None, name: str | None = None) -> Tensor:
    """``depth``-vectors with ``on_value`` (1) at each index, ``off_value`` (0) elsewhere;
    indices outside ``[0, depth)`` give all ``off_value``."""
    x = as_tensor(indices, "one_hot")
    if axis not in (None, -1):
        raise ConfigError(f"one_hot: axis={axis} is not supported; the classes axis is last")
    on = 1.0 if on_value is None else float(on_value)
    off = 0.0 if off_value is None else float(off_value)
    squeeze = isinstance(x, LabelTensor) and x.tf_shape == () and x.shape == (1,)
    shape = (*(() if squeeze else x.shape), int(depth))
    kind = dtype if dtype is not None else (
        "int32" if isinstance(on_value, (int, np.integer)) and not isinstance(on_value, bool)
        else "float32")
    return _add("OneHot", [x], name or "one_hot", shape,
                {"depth": int(depth), "on_value": on, "off_value": off,
                 "squeeze_input": squeeze}, dtype=as_dtype(kind).name)


def cast(x: Any, dtype: Any, name: str | None = None) -> Tensor:
    """``x`` as ``dtype``: integers truncate toward zero, bools are ``x != 0`` (neither has a
    gradient); floats pass values and gradients."""
    if isinstance(x, Loss):
        raise ConfigError("cast: a loss is already a float32 scalar")
    t = as_tensor(x, "cast")
    kind = as_dtype(dtype)
    if kind.name == "string":
        raise ConfigError("cast: tensors cannot become strings here (strings are raw features "
                          "a feature column reads)")
    if kind.name == t.dtype and not isinstance(t, LabelTensor):
        return t
    out = _add("Cast", [t], name or "Cast", t.shape, {"dtype": kind.name}, dtype=kind.name)
    if isinstance(t, LabelTensor):  # keeps what TensorFlow's shape of the labels was
        out = LabelTensor(t.graph, out.name, out.shape, t.tf_shape)
        out.dtype = kind.name
    return out


def to_float(x: Any, name: str | None = None) -> Tensor:
    return cast(x, "float32", name)


def to_int32(x: Any, name: str | None = None) -> Tensor:
    return cast(x, "int32", name)


def to_int64(x: Any, name: str | None = None) -> Tensor:
    return cast(x, "int64", name)


def reduce_mean(input_tensor: Any, axis: Any = None, keepdims: bool = False,
                name: str | None = None, reduction_indices: Any = None,
                keep_dims: bool | None = None) -> Tensor:
    """The mean along per-example ``axis``; with no axis, the mean of every value of the
    batch: a scalar, which here is a loss (``tf.reduce_mean(per_example_loss)``)."""
    return _reduce("ReduceMean", input_tensor, axis if axis is not None else reduction_indices,
                   keepdims if keep_dims is None else keep_dims, name, "reduce_mean")


def reduce_sum(input_tensor: Any, axis: Any = None, keepdims: bool = False,
               name: str | None = None, reduction_indices: Any = None,
               keep_dims: bool | None = None) -> Tensor:
    """The sum along per-example ``axis`` (a sum over the batch is refused: its scale follows
    the batch size; reduce_mean is the loss)."""
    return _reduce("ReduceSum", input_tensor, axis if axis is not None else reduction_indices,
                   keepdims if keep_dims is None else keep_dims, name, "reduce_sum")


def _reduce(kind: str, value: Any, axis: Any, keepdims: bool, name: str | None,
            op: str) -> Tensor:
    if isinstance(value, Loss):
        return value  # already the batch's scalar
    x = as_tensor(value, op)
    if axis is None:
        if kind != "ReduceMean":
            raise ConfigError("reduce_sum over the whole batch is not supported (a loss here is "
                              "a mean over the batch): use reduce_mean, or give a per-example "
                              "axis")
        g = current_graph(op)
        lname = g.unique(name or "Mean")
        g.add_layer({"name": lname, "type": "ReduceMeanLoss", "bottom": x.name, "top": lname},
                    [lname], [(1,)])
        return Loss(g, {lname: 1.0})
    axes = _per_example_axes(x, axis, op)
    out = x
    for a in axes:
        shape = list(out.shape)
        shape[a - 1] = 1
        out = _add(kind, [out], name or kind, tuple(shape), {"axis": a})
    if keepdims:
        return out
    return _reshaped(out, tuple(d for i, d in enumerate(x.shape) if i + 1 not in axes),
                     (name or kind) + "/squeeze")


def reshape(tensor: Any, shape: Sequence[Any], name: str | None = None) -> Tensor:
    """``tf.reshape`` with the batch first (``-1`` or None); one other ``-1`` is inferred."""
    x = as_tensor(tensor, "reshape")
    dims = [None if d is None else int(d) for d in shape]
    if not dims or dims[0] not in (-1, None):
        raise ConfigError(f"reshape: the first dimension of {list(shape)} must be -1 (the "
                          "batch); the batch cannot be reshaped here")
    rest = dims[1:]
    n = int(np.prod(_shape_of(x), dtype=np.int64)) if _shape_of(x) else 1
    if rest.count(-1) + rest.count(None) > 1:
        raise ConfigError(f"reshape: {list(shape)} has more than one unknown dimension")
    known = int(np.prod([d for d in rest if d not in (-1, None)], dtype=np.int64)) if rest else 1
    rest = [n // known if d in (-1, None) else d for d in rest]
    if int(np.prod(rest, dtype=np.int64)) != n:
        raise ConfigError(f"reshape: [batch, {', '.join(map(str, _shape_of(x)))}] cannot "
                          f"become {list(shape)}")
    return _reshaped(x, tuple(rest), name or "Reshape")


def expand_dims(input: Any, axis: int, name: str | None = None) -> Tensor:
    """A size-1 axis inserted at TensorFlow axis ``axis`` (not before the batch)."""
    x = as_tensor(input, "expand_dims")
    shape = list(_shape_of(x))
    a = int(axis) + len(shape) + 2 if int(axis) < 0 else int(axis)
    if not 1 <= a <= len(shape) + 1:
        raise ConfigError(f"expand_dims: axis {axis} is not after the batch axis")
    shape.insert(a - 1, 1)
    return _reshaped(x, tuple(shape), name or "ExpandDims")


def squeeze(input: Any, axis: Any = None, name: str | None = None,
            squeeze_dims: Any = None) -> Tensor:
    """Size-1 per-example axes removed (those of ``axis``, else all)."""
    x = as_tensor(input, "squeeze")
    shape = _shape_of(x)
    axis = axis if axis is not None else squeeze_dims
    drop = ([i + 1 for i, d in enumerate(shape) if d == 1] if axis is None
            else _per_example_axes(x, axis, "squeeze"))
    if any(shape[a - 1] != 1 for a in drop):
        raise ConfigError(f"squeeze: axis {axis} of shape [batch, {shape}] is not of size 1")
    return _reshaped(x, tuple(d for i, d in enumerate(shape) if i + 1 not in drop),
                     name or "Squeeze")


def getitem(x: Tensor, index: Any) -> Tensor:
    """``t[:, tf.newaxis]``, ``t[:, i]``, ``t[:, a:b]`` (and ``t[..., i]`` on the last axis):
    the batch axis is kept whole."""
    items = index if isinstance(index, tuple) else (index,)
    if items and items[0] is Ellipsis and len(items) == 2:
        return _last_axis(x, items[1])
    if not items or items[0] != slice(None):
        raise ConfigError(f"tensor index {index!r}: the first index must be ':' (the whole "
                          "batch), as in t[:, tf.newaxis] or t[:, 0]")
    rest = items[1:]
    if all(i is None for i in rest):
        return _reshaped(x, (*x.shape, *([1] * len(rest))), "newaxis") if rest else x
    if len(rest) == 1 and len(x.shape) == 1:
        return _last_axis(x, rest[0])
    raise ConfigError(f"tensor index {index!r} is not supported: use t[:, tf.newaxis], "
                      "t[:, i] or t[:, a:b] on [batch, n] tensors, or t[..., i]")


def _last_axis(x: Tensor, item: Any) -> Tensor:
    n = x.shape[-1] if x.shape else 0
    if isinstance(item, (int, np.integer)):
        i = int(item) + n if int(item) < 0 else int(item)
        if not 0 <= i < n:
            raise ConfigError(f"tensor index {item} is outside the last axis of size {n}")
        part = _add("Slice", [x], "strided_slice", (*x.shape[:-1], 1), {"ranges": [[i, i + 1]]})
        return _reshaped(part, x.shape[:-1], "strided_slice/squeeze")
    if isinstance(item, slice) and item.step in (None, 1):
        a, b, _ = item.indices(n)
        if b <= a:
            raise ConfigError(f"tensor slice {item} of an axis of size {n} is empty")
        return _add("Slice", [x], "strided_slice", (*x.shape[:-1], b - a), {"ranges": [[a, b]]})
    raise ConfigError(f"tensor index {item!r} is not supported (an int or a slice with step 1)")


def identity(input: Any, name: str | None = None) -> Tensor:
    return input if isinstance(input, Tensor) else as_tensor(input, "identity")


__all__ = [
    "add", "arg_max", "argmax", "cast", "constant", "divide", "expand_dims", "getitem",
    "identity", "multiply", "newaxis", "one_hot", "reduce_mean", "reduce_sum", "reshape",
    "squeeze", "subtract", "to_float", "to_int32", "to_int64", "truediv",
]


def _install_operators() -> None:
    """Tensor's arithmetic and indexing operators, built by the ops above (numbers
    become constants; shapes broadcast per sample), so model_fn bodies read as they do in
    TensorFlow."""
    Tensor.__add__ = lambda self, other: add(self, other)
    Tensor.__radd__ = lambda self, other: add(other, self)
    Tensor.__sub__ = lambda self, other: subtract(self, other)
    Tensor.__rsub__ = lambda self, other: subtract(other, self)
    Tensor.__mul__ = lambda self, other: multiply(self, other)
    Tensor.__rmul__ = lambda self, other: multiply(other, self)
    Tensor.__truediv__ = lambda self, other: divide(self, other)
    Tensor.__neg__ = lambda self: multiply(self, -1.0)
    Tensor.__getitem__ = lambda self, index: getitem(self, index)


_install_operators()
