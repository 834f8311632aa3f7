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


def _loss(kind: str, logits: Any, labels: Any, weights: Any, name: str,
          weighted_kind: str | None = None) -> Loss:
    g = current_graph(name)
    x = as_tensor(logits, name)
    y = _label(g, labels, name, x.width)
    w = _weights(g, weights, name)
    lname = g.unique(name)
    bottoms = [x.name, y.name]
    if w is not None:
        kind = weighted_kind or kind
        bottoms.append(w.name)
    layer = {"name": lname, "type": kind, "bottom": bottoms, "top": lname}
    g.add_layer(layer, [lname], [(1,)])
    loss = Loss(g, {lname: 1.0})
    g.losses.append(loss)
    return loss


def sigmoid_cross_entropy(multi_class_labels: Any, logits: Any, weights: Any = 1.0,
                          name: str | None = None) -> Loss:
    """Mean binary cross entropy of ``logits`` (sigmoid fused in) against 0/1 labels."""
    return _loss("BinaryCrossEntropyLoss", logits, multi_class_labels, weights,
                 name or "sigmoid_cross_entropy_loss", "WeightedBinaryCrossEntropyLoss")


def sparse_softmax_cross_entropy(labels: Any, logits: Any, weights: Any = 1.0,
                                 name: str | None = None) -> Loss:
    """Mean softmax cross entropy; ``labels`` hold class indices."""
    return _loss("CrossEntropyLoss", logits, labels, weights,
                 name or "sparse_softmax_cross_entropy_loss", "WeightedCrossEntropyLoss")


def softmax_cross_entropy(onehot_labels: Any, logits: Any, weights: Any = 1.0,
                          label_smoothing: float = 0.0, scope: Any = None,
                          loss_collection: Any = None, reduction: Any = None,
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
    how = str(getattr(reduction, "value", reduction) or "").lower()
    if how in ("none", "sum", "weighted_sum"):
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


def mean_squared_error(labels: Any, predictions: Any, weights: Any = 1.0,
                       name: str | None = None) -> Loss:
    """Mean of squared differences (weighted mean with ``weights``)."""
    return _loss("MeanSquaredErrorLoss", predictions, labels, weights,
                 name or "mean_squared_error_loss")


def get_total_loss(add_regularization_losses: bool = True, name: str | None = None) -> Loss:
    """The sum of every loss the ``model_fn`` has made so far."""
    g = current_graph("get_total_loss")
    if not g.losses:
        raise ConfigError("get_total_loss: the model_fn has made no loss yet")
    total = g.losses[0]
    for loss in g.losses[1:]:
        total = total + loss
    return total


__all__ = ["LabelTensor", "Loss", "get_total_loss", "mean_squared_error",
           "sigmoid_cross_entropy", "softmax_cross_entropy", "sparse_softmax_cross_entropy"]
