"""Evaluation metrics: HugeCTR's ``MetricsType`` (AUC, AverageLoss, HitRate).

Each metric accumulates over the evaluation batches of one evaluation and reports one number,
as ``Model.get_eval_metrics`` does:

* AUC: the exact area under the ROC curve of every prediction seen; tied predictions of a
  positive and a negative count one half (the average-rank result that
  ``sklearn.metrics.roc_auc_score`` computes).
  A label counts as positive when it is > 0.5.  With ``label_dim > 1`` each label column gets
  its AUC and the mean is reported.  NaN when the labels hold only one class.
* AverageLoss: the mean of the per-batch losses.
* HitRate: HugeCTR's definition (``metrics.cu``, ``collect_hits``): among the predictions
  above 0.8, the fraction whose label is 1; 0 when no prediction is above 0.8.
"""

from __future__ import annotations

import enum
from typing import Any

import numpy as np

from tierserve.core.errors import InvalidInputError

HIT_RATE_THRESHOLD = 0.8


class MetricsType(enum.Enum):
    """The metrics of ``hugectr.MetricsType``."""

    AUC = "AUC"
    AverageLoss = "AverageLoss"
    HitRate = "HitRate"


def _host_1d(array: Any) -> np.ndarray:
    get = getattr(array, "get", None)
    array = get() if get is not None and not isinstance(array, np.ndarray) else array
    return np.asarray(array, dtype=np.float64).reshape(-1)


def auc_score(labels: Any, predictions: Any) -> float:
    """Exact ROC AUC of one label column, ties counting one half (sklearn's ``roc_auc_score``
    with average ranks), O(n log n) and vectorised."""
    y = _host_1d(labels) > 0.5
    p = _host_1d(predictions)
    if y.shape != p.shape:
        raise InvalidInputError(
            f"labels and predictions differ in size: {y.shape[0]} vs {p.shape[0]}")
    n_pos = int(y.sum())
    n_neg = y.shape[0] - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    # AUC = P(score of a positive > score of a negative), ties counting one half: for each
    # positive, count the negatives below it and equal to it (two sorts, two searchsorted;
    # identical to the average-rank formula of roc_auc_score)
    neg = np.sort(p[~y])
    pos = np.sort(p[y])
    below = np.searchsorted(neg, pos, side="left")
    at_or_below = np.searchsorted(neg, pos, side="right")
    wins = float(below.sum()) + 0.5 * float((at_or_below - below).sum())
    return wins / (n_pos * n_neg)


def hit_rate(labels: Any, predictions: Any, threshold: float = HIT_RATE_THRESHOLD) -> float:
    """Among predictions > ``threshold``, the fraction labelled 1 (0 when there are none)."""
    y = _host_1d(labels)
    p = _host_1d(predictions)
    checked = p > threshold
    n = int(checked.sum())
    return float((y[checked] == 1.0).sum()) / n if n else 0.0


class Metric:
    """One metric accumulated over an evaluation: ``update`` per batch, then ``result``."""

    name = ""

    def reset(self) -> None:
        raise NotImplementedError

    def update(self, labels: Any, predictions: Any, loss: float | None = None) -> None:
        raise NotImplementedError

    def result(self) -> float:
        raise NotImplementedError


class AUC(Metric):
    name = "AUC"

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._labels: list[np.ndarray] = []
        self._preds: list[np.ndarray] = []

    def update(self, labels, predictions, loss=None):
        labels = _as_2d(labels)
        predictions = positive_class(labels, _as_2d(predictions))
        if labels.shape != predictions.shape:
            raise InvalidInputError(
                f"AUC: labels {labels.shape} and predictions {predictions.shape} differ")
        self._labels.append(labels)
        self._preds.append(predictions)

    def result(self) -> float:
        if not self._labels:
            return float("nan")
        labels = np.concatenate(self._labels)
        preds = np.concatenate(self._preds)
        return float(np.mean([auc_score(labels[:, j], preds[:, j])
                              for j in range(labels.shape[1])]))


class AverageLoss(Metric):
    name = "AverageLoss"

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._sum = 0.0
        self._count = 0

    def update(self, labels, predictions, loss=None):
        if loss is None:
            raise InvalidInputError("AverageLoss needs the batch's loss")
        self._sum += float(loss)
        self._count += 1

    def result(self) -> float:
        return self._sum / self._count if self._count else float("nan")


class HitRate(Metric):
    name = "HitRate"

    def __init__(self, threshold: float = HIT_RATE_THRESHOLD) -> None:
        self.threshold = threshold
        self.reset()

    def reset(self) -> None:
        self._checked = 0
        self._hits = 0

    def update(self, labels, predictions, loss=None):
        y = _host_1d(labels)
        p = positive_class(_as_2d(labels), _as_2d(predictions)).reshape(-1)
        checked = p > self.threshold
        self._checked += int(checked.sum())
        self._hits += int((y[checked] == 1.0).sum())

    def result(self) -> float:
        return self._hits / self._checked if self._checked else 0.0


def positive_class(labels: np.ndarray, predictions: np.ndarray) -> np.ndarray:
    """The positive class's column when a two-class softmax (``CrossEntropyLoss``) predicts a
    binary label ``[B, 1]``: HugeCTR's AUC is over that class.  Otherwise ``predictions``."""
    if labels.shape[1] == 1 and predictions.ndim == 2 and predictions.shape[1] == 2:
        return predictions[:, 1:2]
    return predictions


def _as_2d(array: Any) -> np.ndarray:
    get = getattr(array, "get", None)
    array = get() if get is not None and not isinstance(array, np.ndarray) else array
    a = np.asarray(array, dtype=np.float64)
    return a.reshape(a.shape[0], -1) if a.ndim else a.reshape(1, 1)


_METRICS = {MetricsType.AUC: AUC, MetricsType.AverageLoss: AverageLoss,
            MetricsType.HitRate: HitRate}


def make_metric(kind: MetricsType | str) -> Metric:
    """A fresh accumulator for ``kind``."""
    if not isinstance(kind, MetricsType):
        try:
            kind = MetricsType(str(kind))
        except ValueError:
            raise InvalidInputError(
                f"metric must be one of {', '.join(MetricsType.__members__)}, got {kind!r}"
            ) from None
    return _METRICS[kind]()


class Metrics:
    """The metrics of a solver's ``metrics_spec`` ({MetricsType: stop threshold})."""

    def __init__(self, metrics_spec: dict[Any, float] | None = None) -> None:
        spec = {MetricsType.AUC: 1.0} if metrics_spec is None else metrics_spec
        self.metrics = [make_metric(k) for k in spec]
        self.thresholds = {m.name: float(v) for m, v in zip(self.metrics, spec.values())}

    def reset(self) -> None:
        for m in self.metrics:
            m.reset()

    def update(self, labels: Any, predictions: Any, loss: float | None = None) -> None:
        for m in self.metrics:
            if loss is not None or not isinstance(m, AverageLoss):
                m.update(labels, predictions, loss)

    def results(self) -> list[tuple[str, float]]:
        """``[(name, value), ...]`` in spec order, as ``Model.get_eval_metrics`` returns."""
        return [(m.name, m.result()) for m in self.metrics]
