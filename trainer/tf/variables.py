"""``tf.Variable`` and ``tf.get_variable``: variables a ``model_fn`` uses as tensors.

A variable is a ``Variable`` layer of the graph (:mod:`tierserve.trainer.estimator.layer_types`):
its value is the layer's parameter, the same for every example, trained by the optimizer of
the train op that owns its name like any weight, checkpointed under its name
(``Estimator.get_variable_value("w")``).  ``tf.Variable(0.1, name="w") * x`` broadcasts per
example.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError
from tierserve.trainer.graph.ops import _add, dense_input
from tierserve.trainer.graph.tensors import Tensor, current_graph


def _make(name: str, shape: tuple[int, ...], initial: Callable | None, trainable: bool,
          frozen_value: Any = None) -> Tensor:
    g = current_graph("Variable")
    lname = g.unique(name)
    out = _add("Variable", [dense_input(g)], lname, shape, {"shape": list(shape)}, [lname])
    if initial is not None:
        g.initial[lname] = initial
    if not trainable:
        g.frozen[lname] = frozen_value  # None: stays at its initial value
    g.variables[name] = out
    return out


def Variable(initial_value: Any = None, trainable: bool = True, name: str | None = None,  # noqa: N802
             dtype: Any = None, shape: Any = None, **kwargs: Any) -> Tensor:
    """A variable starting at ``initial_value`` (a number, an array, or a function returning
    one); ``trainable=False`` keeps it there."""
    _refuse_extra("Variable", kwargs, ("validate_shape", "caching_device", "collections",
                                       "use_resource", "synchronization", "aggregation"))
    if initial_value is None:
        raise ConfigError("Variable: initial_value is required")
    value = initial_value() if callable(initial_value) else initial_value
    arr = np.asarray(value, dtype=np.float32)
    if shape is not None and tuple(int(d) for d in shape) != arr.shape:
        raise ConfigError(f"Variable {name!r}: shape {list(shape)} differs from the initial "
                          f"value's {list(arr.shape)}")
    return _make(name or "Variable", arr.shape, lambda s, v=arr: v.copy(), trainable,
                 arr.copy() if not trainable else None)


def get_variable(name: str, shape: Sequence[int] | None = None, dtype: Any = None,
                 initializer: Any = None, regularizer: Any = None, trainable: bool = True,
                 partitioner: Any = None, **kwargs: Any) -> Tensor:
    """The variable ``name`` of this ``model_fn`` call, created on first use (a second call
    with the name gives the same variable, as with ``reuse=tf.AUTO_REUSE``).  ``initializer``:
    a number, an array or a function of the shape; default TensorFlow's Glorot uniform."""
    _refuse_extra("get_variable", kwargs, ("collections", "caching_device", "validate_shape",
                                           "use_resource", "custom_getter", "constraint",
                                           "synchronization", "aggregation"))
    if regularizer is not None:
        raise ConfigError(f"get_variable {name!r}: regularizer is not supported; add the "
                          "penalty to the loss")
    if partitioner is not None:
        raise ConfigError(f"get_variable {name!r}: partitioner is not supported (a variable "
                          "lives whole in this process; embedding tables shard by "
                          "mpiexec ranks)")
    g = current_graph("get_variable")
    have = g.variables.get(name)
    if have is not None:
        if shape is not None and tuple(int(d) for d in shape) != have.shape:
            raise ConfigError(f"get_variable {name!r}: exists with shape {list(have.shape)}, "
                              f"asked for {list(shape)}")
        return have
    if initializer is not None and not callable(initializer):
        value = np.asarray(initializer, dtype=np.float32)
        shape = value.shape if shape is None else tuple(int(d) for d in shape)
        return _make(name, tuple(shape), lambda s, v=value: np.broadcast_to(v, s).copy(),
                     trainable)
    if shape is None:
        raise ConfigError(f"get_variable {name!r}: give a shape (or an initial value)")
    init = None if initializer is None else (
        lambda s, f=initializer: np.asarray(f(s), dtype=np.float32))
    return _make(name, tuple(int(d) for d in shape), init, trainable)


def _refuse_extra(what: str, kwargs: dict, known: tuple[str, ...]) -> None:
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise ConfigError(f"{what}: unknown argument(s) {unknown}")
    set_ = sorted(k for k, v in kwargs.items() if v not in (None, True))
    if set_:
        raise ConfigError(f"{what}: {', '.join(set_)} are TensorFlow graph settings with no "
                          "meaning here; remove them")


__all__ = ["Variable", "get_variable"]
