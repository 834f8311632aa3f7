"""Losses for ``model_fn`` bodies (as ``tf.losses``): each adds a loss layer to the graph.

A loss is a :class:`Loss` tensor; ``loss_a + 0.1 * loss_b`` is a weighted total whose
gradient the trainer's backward computes in one pass; :func:`get_total_loss` sums every loss
the ``model_fn`` made.
"""

from __future__ import annotations

from typing import Any

from tierserve.core.errors import ConfigError
from tierserve.trainer.graph.tensors import Graph, LabelTensor, Tensor, as_tensor, current_graph


class Loss(Tensor):
    """A scalar loss: a weighted sum of loss layers' outputs (``terms``: top -> weight)."""

    def __init__(self, graph: Graph, terms: dict[str, float]) -> None:
        super().__init__(graph, next(iter(terms)), (1,))
        self.terms = dict(terms)

    def __add__(self, other: Any) -> Loss:
        if isinstance(other, (int, float)) and other == 0:
            return self
        if not isinstance(other, Loss):
            raise ConfigError("a loss can only be added to another loss")
        terms = dict(self.terms)
        for k, v in other.terms.items():
            terms[k] = terms.get(k, 0.0) + v
        return Loss(self.graph, terms)

    __radd__ = __add__

    def __mul__(self, factor: Any) -> Loss:
        if not isinstance(factor, (int, float)):
            raise ConfigError("a loss can only be scaled by a number")
        return Loss(self.graph, {k: v * float(factor) for k, v in self.terms.items()})

    __rmul__ = __mul__


def _label(graph: Graph, labels: Any, what: str, width: int) -> Tensor:
    if isinstance(labels, Tensor):
        return labels
    if labels is None:
        raise ConfigError(f"{what}: labels is None (the input_fn gave no labels)")
    raise ConfigError(f"{what}: labels must be the labels model_fn received")


def _weights(graph: Graph, weights: Any, what: str) -> Tensor | None:
    if weights is None or (isinstance(weights, (int, float)) and float(weights) == 1.0):
        return None
    if isinstance(weights, (int, float)):
        raise ConfigError(f"{what}: a constant weight other than 1.0 only scales the loss; "
                          "multiply the loss instead")
    return as_tensor(weights, f"{what} weights")


class Reduction:
    """``tf.compat.v1.losses.Reduction`` (and keras' ``tf.losses.Reduction`` names)."""

    NONE = "none"
    SUM = "weighted_sum"
    SUM_OVER_BATCH_SIZE = "weighted_sum_over_batch_size"
    MEAN = "weighted_mean"
    SUM_BY_NONZERO_WEIGHTS = "weighted_sum_by_nonzero_weights"
    SUM_OVER_NONZERO_WEIGHTS = SUM_BY_NONZERO_WEIGHTS
    AUTO = "auto"


#: Reduction names (TensorFlow 1 and keras spellings) -> the loss layers' ``reduction``.
_REDUCTION = {
    "weighted_sum": "sum", "sum": "sum", "weighted_sum_over_batch_size": "mean",
    "sum_over_batch_size": "mean", "auto": "mean", "weighted_mean": "weighted_mean",
    "mean": "weighted_mean", "weighted_sum_by_nonzero_weights": "nonzero_weights",
    "sum_by_nonzero_weights": "nonzero_weights",
}


def reduction_of(value: Any, what: str) -> str:
    """The loss layers' reduction for a TensorFlow ``Reduction`` value (or its name)."""
    key = str(getattr(value, "value", getattr(value, "name", value))).lower()
    if key not in _REDUCTION:
        raise ConfigError(f"{what}: reduction {value!r} is not supported (a scalar loss: "
                          "SUM, SUM_OVER_BATCH_SIZE, MEAN or SUM_BY_NONZERO_WEIGHTS)")
    return _REDUCTION[key]


def _loss(kind: str, logits: Any, labels: Any, weights: Any, name: str,
          reduced_kind: str, reduction: Any) -> Loss:
    """A loss layer: HugeCTR's ``kind`` (the plain mean) when that is what is asked, else
    the Estimator's ``reduced_kind`` with example weights and the reduction."""
    g = current_graph(name)
    x = as_tensor(logits, name)
    y = _label(g, labels, name, x.width)
    w = _weights(g, weights, name)
    how = reduction_of(reduction, name)
    lname = g.unique(name)
    bottoms = [x.name, y.name]
    layer: dict[str, Any] = {"name": lname, "type": kind, "bottom": bottoms, "top": lname}
    if w is not None or how not in ("mean", "nonzero_weights", "weighted_mean"):
        layer["type"] = reduced_kind
        layer["reduction"] = how
        if w is not None:
            bottoms.append(w.name)
    g.add_layer(layer, [lname], [(1,)])
    loss = Loss(g, {lname: 1.0})
    g.losses.append(loss)
    return loss


def _no_smoothing(label_smoothing: float, what: str) -> None:
    if label_smoothing:
        raise ConfigError(f"{what}: label_smoothing={label_smoothing} is not supported")


def sigmoid_cross_entropy(multi_class_labels: Any, logits: Any, weights: Any = 1.0,
                          label_smoothing: float = 0, scope: Any = None,
                          loss_collection: Any = None,
                          reduction: Any = Reduction.SUM_BY_NONZERO_WEIGHTS,
                          name: str | None = None) -> Loss:
    """Binary cross entropy of ``logits`` (sigmoid fused in) against 0/1 labels, reduced as
    ``tf.compat.v1.losses`` does (default: over the examples with a non-zero weight)."""
    _no_smoothing(label_smoothing, "sigmoid_cross_entropy")
    return _loss("BinaryCrossEntropyLoss", logits, multi_class_labels, weights,
                 name or scope or "sigmoid_cross_entropy_loss",
                 "WeightedBinaryCrossEntropyLoss", reduction)


def sparse_softmax_cross_entropy(labels: Any, logits: Any, weights: Any = 1.0,
                                 scope: Any = None, loss_collection: Any = None,
                                 reduction: Any = Reduction.SUM_BY_NONZERO_WEIGHTS,
                                 name: str | None = None) -> Loss:
    """Softmax cross entropy; ``labels`` hold class indices."""
    return _loss("CrossEntropyLoss", logits, labels, weights,
                 name or scope or "sparse_softmax_cross_entropy_loss",
                 "WeightedCrossEntropyLoss", reduction)


def softmax_cross_entropy(onehot_labels: Any, logits: Any, weights: Any = 1.0,
                          label_smoothing: float = 0.0, scope: Any = None,
                          loss_collection: Any = None,
                          reduction: Any = Reduction.SUM_BY_NONZERO_WEIGHTS,
                          name: str | None = None) -> Loss:
    """Softmax cross entropy against label distributions of the logits' shape
    (``one_hot(labels, n)``, or soft labels), averaged over the examples (what every
    TensorFlow reduction but ``SUM`` / ``NONE`` gives without weights); ``label_smoothing``
    as TensorFlow."""
    what = "softmax_cross_entropy"
    g = current_graph(what)
    if _weights(g, weights, what) is not None:
        raise ConfigError(f"{what}: per-example weights are not supported; use "
                          "sparse_softmax_cross_entropy(class ids, logits, weights=...)")
    if reduction_of(reduction, what) == "sum":
        raise ConfigError(f"{what}: reduction {reduction!r} is not supported; the loss is the "
                          "mean over the examples")
    if not 0.0 <= float(label_smoothing) < 1.0:
        raise ConfigError(f"{what}: label_smoothing must lie in [0, 1), got {label_smoothing}")
    x = as_tensor(logits, what)
    y = _label(g, onehot_labels, what, x.width)
    lname = g.unique(name or scope or "softmax_cross_entropy_loss")
    layer = {"name": lname, "type": "SoftmaxCrossEntropyLoss", "bottom": [x.name, y.name],
             "top": lname}
    if label_smoothing:
        layer["label_smoothing"] = float(label_smoothing)
    g.add_layer(layer, [lname], [(1,)])
    loss = Loss(g, {lname: 1.0})
    g.losses.append(loss)
    return loss


def mean_squared_error(labels: Any, predictions: Any, weights: Any = 1.0, scope: Any = None,
                       loss_collection: Any = None,
                       reduction: Any = Reduction.SUM_BY_NONZERO_WEIGHTS,
                       name: str | None = None) -> Loss:
    """Squared differences, reduced as ``tf.compat.v1.losses`` does."""
    return _loss("MeanSquaredErrorLoss", predictions, labels, weights,
                 name or scope or "mean_squared_error_loss", "MeanSquaredErrorLoss",
                 reduction)


def get_total_loss(add_regularization_losses: bool = True, name: str | None = None) -> Loss:
    """The sum of every loss the ``model_fn`` has made so far."""
    g = current_graph("get_total_loss")
    if not g.losses:
        raise ConfigError("get_total_loss: the model_fn has made no loss yet")
    total = g.losses[0]
    for loss in g.losses[1:]:
        total = total + loss
    return total


__all__ = ["LabelTensor", "Loss", "Reduction", "get_total_loss", "mean_squared_error",
           "reduction_of", "sigmoid_cross_entropy", "softmax_cross_entropy",
           "sparse_softmax_cross_entropy"]
