"""Evaluation metrics for ``eval_metric_ops`` (as ``tf.metrics``).

Each function returns a :class:`MetricOp` naming the graph tensors it reads; evaluation
accumulates it over every batch (AUC through the trainer's exact
:class:`~tierserve.trainer.metrics.AUC`).  Integer predictions (class ids: ``tf.argmax``,
``tf.cast(..., tf.int64)``) are compared with the labels exactly, as TensorFlow's
``accuracy`` does; float predictions of width 1 are probabilities (thresholded at 0.5 for
accuracy, precision and recall); wider ones are per-class scores (their argmax is the
predicted class).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.trainer.graph.tensors import Tensor, as_tensor

from ..metrics import AUC


def _classes(pred: np.ndarray) -> np.ndarray:
    pred = pred.reshape(len(pred), -1)
    if pred.dtype.kind in "iub":  # class ids already
        return pred.reshape(-1).astype(np.int64)
    if pred.shape[1] == 1:
        return (pred[:, 0] >= 0.5).astype(np.int64)
    return pred.argmax(axis=1)


class MetricOp:
    """One metric: ``kind`` over the values of ``tensors`` (graph tensor names, or
    ``"__label__"`` for the labels), accumulated by :meth:`update`."""

    def __init__(self, kind: str, tensors: list[Tensor], threshold: float = 0.5) -> None:
        self.kind = kind
        self.tensors = tensors
        self.threshold = threshold
        self.reset()

    def reset(self) -> None:
        self._auc = AUC() if self.kind == "auc" else None
        self._num = 0.0
        self._den = 0.0

    def update(self, values: list[np.ndarray], weights: np.ndarray | None = None) -> None:
        if self.kind == "auc":
            labels, pred = values
            self._auc.update(labels.reshape(-1, 1), pred.reshape(len(pred), -1)[:, -1:])
            return
        if self.kind == "mean":
            v = values[0].astype(np.float64).reshape(-1)
            self._num += float(v.sum())
            self._den += v.size
            return
        labels = values[0].reshape(len(values[0]), -1)
        pred = values[1].reshape(len(values[1]), -1)
        if self.kind == "mean_squared_error":
            d = pred.astype(np.float64) - labels
            self._num += float((d * d).sum())
            self._den += d.size
            return
        classes = _classes(pred)
        if pred.dtype.kind in "iub":  # ids against ids, element by element
            y = labels.reshape(-1).astype(np.int64)
            if y.shape != classes.shape:
                raise InvalidInputError(f"{self.kind}: labels have {y.size} values, the "
                                        f"predictions {classes.size}")
        else:
            y = labels[:, 0].astype(np.int64) if labels.shape[1] == 1 else labels.argmax(axis=1)
        if self.kind == "accuracy":
            self._num += float((classes == y).sum())
            self._den += len(y)
        elif self.kind == "precision":
            self._num += float(((classes == 1) & (y == 1)).sum())
            self._den += float((classes == 1).sum())
        elif self.kind == "recall":
            self._num += float(((classes == 1) & (y == 1)).sum())
            self._den += float((y == 1).sum())

    def result(self) -> float:
        if self.kind == "auc":
            return float(self._auc.result())
        return float(self._num / self._den) if self._den else 0.0

    # TensorFlow's metrics are (value_op, update_op) pairs; code that unpacks or indexes one
    # (``accuracy[1]``) gets this op for both
    def __iter__(self):
        return iter((self, self))

    def __getitem__(self, index: int) -> MetricOp:
        if index not in (0, 1, -1, -2):
            raise IndexError(f"a metric is a (value, update) pair; index {index} is outside it")
        return self


def auc(labels: Any, predictions: Any, weights: Any = None, num_thresholds: int = 200,
        metrics_collections: Any = None, updates_collections: Any = None, curve: str = "ROC",
        name: str | None = None, summation_method: str = "trapezoidal",
        thresholds: Any = None) -> MetricOp:
    """Area under the ROC curve over every evaluated example, computed exactly (the value
    TensorFlow's ``num_thresholds`` buckets and ``summation_method`` approximate, so those
    change nothing).  Example ``weights``, ``curve='PR'`` and collections are refused."""
    if weights is not None:
        raise ConfigError("auc: weights are not supported (the AUC counts every example once)")
    if str(curve).upper() != "ROC":
        raise ConfigError(f"auc: curve={curve!r} is not supported; the ROC AUC is computed")
    if metrics_collections is not None or updates_collections is not None:
        raise ConfigError("auc: metrics_collections / updates_collections are TensorFlow graph "
                          "collections; there are none here")
    if summation_method not in ("trapezoidal", "careful_interpolation", "minoring",
                                "majoring"):
        raise ConfigError(f"auc: unknown summation_method {summation_method!r}")
    return MetricOp("auc", [as_tensor(labels, "auc"), as_tensor(predictions, "auc")])


def accuracy(labels: Any, predictions: Any, name: str | None = None) -> MetricOp:
    return MetricOp("accuracy", [as_tensor(labels, "accuracy"),
                                 as_tensor(predictions, "accuracy")])


def precision(labels: Any, predictions: Any, name: str | None = None) -> MetricOp:
    return MetricOp("precision", [as_tensor(labels, "precision"),
                                  as_tensor(predictions, "precision")])


def recall(labels: Any, predictions: Any, name: str | None = None) -> MetricOp:
    return MetricOp("recall", [as_tensor(labels, "recall"), as_tensor(predictions, "recall")])


def mean(values: Any, name: str | None = None) -> MetricOp:
    """The mean of every value of ``values`` over the evaluation."""
    return MetricOp("mean", [as_tensor(values, "mean")])


def mean_squared_error(labels: Any, predictions: Any, name: str | None = None) -> MetricOp:
    return MetricOp("mean_squared_error", [as_tensor(labels, "mean_squared_error"),
                                           as_tensor(predictions, "mean_squared_error")])


__all__ = ["MetricOp", "accuracy", "auc", "mean", "mean_squared_error", "precision", "recall"]
