"""``tf.summary.scalar`` in a ``model_fn``: the value is written to TensorBoard (under
``model_dir``, every ``save_summary_steps`` training steps) beside the loss.  A loss gives its
value, a metric (``tf.summary.scalar('accuracy', accuracy[1])``) its running value over the
training steps so far, as TensorFlow's streaming metrics do in training."""

from __future__ import annotations

from typing import Any

from tierserve.core.errors import ConfigError
from tierserve.trainer.graph.tensors import Tensor, current_graph

from ..estimator.metrics import MetricOp


def scalar(name: str, tensor: Any, collections: Any = None, family: Any = None,
           description: Any = None) -> Any:
    """Register ``tensor`` (a loss, a metric, or a tensor of one value per example, whose
    batch mean is written) under ``name``; returns ``tensor``."""
    g = current_graph("tf.summary.scalar")
    if collections is not None or family is not None:
        raise ConfigError("summary.scalar: collections and family are not supported")
    if not isinstance(tensor, (Tensor, MetricOp)):
        raise ConfigError(f"summary.scalar {name!r}: expected a tensor, a loss or a metric of "
                          f"the model_fn, got {type(tensor).__name__}")
    if isinstance(tensor, Tensor) and tensor.width != 1:
        raise ConfigError(f"summary.scalar {name!r}: the tensor has {tensor.width} values per "
                          "example; give a scalar (tf.reduce_mean(...), a loss or a metric)")
    g.summaries[str(name)] = tensor
    return tensor


def merge_all(key: Any = None, scope: Any = None, name: Any = None) -> None:
    """Nothing to merge: the Estimator writes every registered scalar itself."""
    return None


__all__ = ["merge_all", "scalar"]
