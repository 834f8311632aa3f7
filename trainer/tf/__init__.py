"""TensorFlow 1's Estimator-era API (``import tensorflow as tf``) on tierserve's trainer.

``from tierserve.trainer import tf`` in place of ``import tensorflow as tf`` (and
``from tierserve.trainer.tf.compat import v1 as tf`` for ``tensorflow.compat.v1``) gives a
``model_fn`` and its input and training code what they use:

- ``tf.estimator``, ``tf.feature_column``, ``tf.data``, ``tf.layers``, ``tf.nn``,
  ``tf.losses``, ``tf.metrics``, ``tf.train``: tierserve's own modules
  (:mod:`tierserve.trainer.estimator` and its ``layers``, ``losses``, ``metrics``,
  ``optimizers``, ``hooks``; :mod:`tierserve.trainer.feature_column`;
  :mod:`tierserve.trainer.data`);
- tensor ops (:mod:`.ops`): ``argmax``, ``one_hot``, ``cast`` / ``to_float``,
  ``reduce_mean`` / ``reduce_sum``, ``reshape``, ``expand_dims``, ``squeeze``, ``concat``,
  ``newaxis`` indexing, ``+ - * /`` with broadcasting, ``constant``; ``Variable`` /
  ``get_variable`` (:mod:`.variables`); dtypes (``tf.float32`` ..., :mod:`.dtypes`);
- ``tf.summary.scalar``, ``tf.logging``, ``tf.app.run``, ``tf.errors.OutOfRangeError``,
  ``tf.compat.v1`` (this module), ``tf.get_logger``, ``tf.device``, ``tf.variable_scope``
  / ``tf.name_scope``.

Every op builds layers of the graph the Estimator runs (one implementation of each, forward
and backward by the trainer's network).  A name this module lacks raises an error naming it
and the closest supported names; Keras and DeepRec's EmbeddingVariable are refused by name
with what to use instead (:mod:`.refusals`).
"""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Any

from tierserve.core.compat import warn_once
from tierserve.trainer.graph.dtypes import (
    DType,
    as_dtype,
    bool,
    double,
    float16,
    float32,
    float64,
    half,
    int8,
    int16,
    int32,
    int64,
    string,
    uint8,
    uint16,
    uint32,
    uint64,
)
from tierserve.trainer.graph.ops import (
    add,
    arg_max,
    argmax,
    cast,
    constant,
    divide,
    expand_dims,
    identity,
    multiply,
    newaxis,
    one_hot,
    reduce_mean,
    reduce_sum,
    reshape,
    squeeze,
    subtract,
    to_float,
    to_int32,
    to_int64,
    truediv,
)
from tierserve.trainer.graph.tensors import current_graph

from .. import data as _data
from .. import estimator as _estimator
from .. import feature_column as _feature_column
from ..data.iterator import OutOfRangeError
from ..estimator import hooks as _hooks
from ..estimator import metrics as _metrics
from ..estimator import optimizers as _optimizers
from ..estimator.export import placeholder, sparse_placeholder
from ..graph import layers as _layers
from ..graph import losses as _losses
from ..graph import ops as _ops
from . import app, keras, summary
from . import tf_logging as logging
from ._namespace import Namespace, RefusedError, UnsupportedError, unsupported
from .refusals import FEATURE_COLUMN_REFUSED, TF_HINTS, TF_REFUSED, TRAIN_REFUSED
from .variables import Variable, get_variable

concat = _layers.concat
sigmoid, tanh = _layers.sigmoid, _layers.tanh
group = _optimizers.group
get_logger = logging.get_logger
AUTO_REUSE = "AUTO_REUSE"

estimator = Namespace("tf.estimator", _estimator)
feature_column = Namespace("tf.feature_column", _feature_column,
                           refused=FEATURE_COLUMN_REFUSED)
data = Namespace("tf.data", _data, {"experimental": Namespace(
    "tf.data.experimental", {"AUTOTUNE": _data.AUTOTUNE})})
layers = Namespace("tf.layers", _layers)
nn = Namespace("tf.nn", _layers)
losses = Namespace("tf.losses", _losses)
metrics = Namespace("tf.metrics", _metrics)
train = Namespace("tf.train", _optimizers, _hooks, refused=TRAIN_REFUSED)
errors = Namespace("tf.errors", {"OutOfRangeError": OutOfRangeError})
math = Namespace("tf.math", _ops, {"sigmoid": _layers.sigmoid, "tanh": _layers.tanh,
                                   "softmax": _layers.softmax})
math_ops = math


def disable_v2_behavior() -> None:
    """TF1 graph behaviour: what this API always has (nothing to switch)."""


disable_eager_execution = disable_v2_behavior


@contextlib.contextmanager
def variable_scope(name_or_scope: Any, default_name: str | None = None, reuse: Any = None,
                   partitioner: Any = None, **kwargs: Any):
    """Prefix the names of the layers and variables made inside (``scope/dense/kernel``);
    variables are shared by name within a ``model_fn`` call (``reuse`` is always
    ``AUTO_REUSE``); partitioners are refused."""
    if partitioner is not None:
        raise unsupported("tf.variable_scope(partitioner=...)", (), *TF_REFUSED[
            "fixed_size_partitioner"])
    name = getattr(name_or_scope, "name", name_or_scope) or default_name or "scope"
    with current_graph("variable_scope").scope(str(name)):
        yield name


name_scope = variable_scope


@contextlib.contextmanager
def device(name: Any):
    """Dense layers run on the host (numpy); ``'/cpu:*'`` is what they do, and a GPU
    request warns once (place embedding tables with HybridBackend's ``emb_device``)."""
    if name and "gpu" in str(name).lower():
        warn_once("tf.device", f"tf.device({name!r}): dense layers run on the host here; "
                  "embedding tables go to a GPU with hb.scope(emb_device='/gpu:0')",
                  stacklevel=4)
    yield


def _module_names() -> list[str]:
    return [n for n in globals() if not n.startswith("_")]


def __getattr__(name: str) -> Any:
    if name in TF_REFUSED:
        raise unsupported(f"tf.{name}", (), *TF_REFUSED[name])
    raise unsupported(f"tf.{name}", _module_names(), instead=TF_HINTS.get(name))


def _compat_module() -> types.ModuleType:
    """``tf.compat``: ``v1`` and ``v2`` are this module itself, so
    ``from tierserve.trainer.tf.compat import v1 as tf`` stands for
    ``import tensorflow.compat.v1 as tf``; ``module_wrapper`` holds TensorFlow's
    deprecation-warning limit, which code sets to silence warnings this module never prints.
    Built here, and registered as a module, because it is this module."""
    module = types.ModuleType(f"{__name__}.compat", _compat_module.__doc__)
    this = sys.modules[__name__]
    module.v1 = module.v2 = this
    module.module_wrapper = types.SimpleNamespace(_PER_MODULE_WARNING_LIMIT=0)
    module.__all__ = ["module_wrapper", "v1", "v2"]
    sys.modules[module.__name__] = module
    return module


compat = _compat_module()

__all__ = [
    "AUTO_REUSE", "DType", "OutOfRangeError", "RefusedError", "UnsupportedError", "Variable",
    "add", "app", "arg_max", "argmax", "as_dtype", "bool", "cast", "concat", "constant",
    "compat", "data", "device", "disable_eager_execution", "disable_v2_behavior", "divide", "double",
    "errors", "estimator", "expand_dims", "feature_column", "float16", "float32", "float64",
    "get_logger", "get_variable", "group", "half", "identity", "int8", "int16", "int32",
    "int64", "keras", "layers", "logging", "losses", "math", "math_ops", "metrics", "multiply",
    "name_scope",
    "newaxis", "nn", "one_hot", "placeholder", "reduce_mean", "reduce_sum", "reshape",
    "sigmoid", "sparse_placeholder", "squeeze", "string", "subtract", "summary", "tanh",
    "to_float", "to_int32", "to_int64", "train", "truediv", "uint8", "uint16", "uint32",
    "uint64", "variable_scope",
]
