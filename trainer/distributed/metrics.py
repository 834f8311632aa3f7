"""Evaluation metrics over every rank's predictions.

Each rank keeps its own labels, predictions and per-batch losses; :meth:`GatheredMetrics.results`
(collective) gathers them, so AUC is the AUC of all predictions, not a mean of per-rank AUCs,
and AverageLoss is the mean over evaluation batches of each global batch's loss (the ranks'
losses weighted by their sample counts), as one process computes them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..metrics import AverageLoss, Metrics, _as_2d


class GatheredMetrics(Metrics):
    """:class:`~tierserve.trainer.metrics.Metrics` whose results span all ranks."""

    def __init__(self, metrics_spec: dict[Any, float] | None, comm: Any,
                 skip: Any = None) -> None:
        super().__init__(metrics_spec)
        self.spec = metrics_spec
        self.comm = comm
        self.skip = skip  # says when the batch evaluated was a placeholder (not counted)
        self.reset()

    def reset(self) -> None:
        super().reset()
        self._labels: list[np.ndarray] = []
        self._preds: list[np.ndarray] = []
        self._losses: list[tuple[float, float]] = []

    def update(self, labels: Any, predictions: Any, loss: float | None = None) -> None:
        if self.skip is not None and self.skip():
            self._losses.append((0.0, 0.0))  # the batch still counts as one per rank
            return
        labels, predictions = _as_2d(labels), _as_2d(predictions)
        self._labels.append(labels)
        self._preds.append(predictions)
        if loss is not None:
            n = float(labels.shape[0])
            self._losses.append((float(loss) * n if n else 0.0, n))

    def results(self) -> list[tuple[str, float]]:
        """``[(name, value), ...]`` over all ranks' batches since the last reset (collective)."""
        comm = self.comm
        width = (self._labels[0].shape[1], self._preds[0].shape[1]) if self._labels else None
        widths, _ = comm.allgatherv(np.asarray([width or (0, 0)], dtype=np.int64),
                                    "metrics: shapes")
        lw, pw = (int(widths[:, 0].max()), int(widths[:, 1].max()))
        labels = (np.concatenate(self._labels) if self._labels
                  else np.empty((0, lw), dtype=np.float64))
        preds = (np.concatenate(self._preds) if self._preds
                 else np.empty((0, pw), dtype=np.float64))
        all_labels, _ = comm.allgatherv(labels, "metrics: labels")
        all_preds, _ = comm.allgatherv(preds, "metrics: predictions")
        losses, counts = comm.allgatherv(np.asarray(self._losses, dtype=np.float64).reshape(-1, 2),
                                         "metrics: losses")
        merged = Metrics(self.spec)
        if all_labels.shape[0]:
            merged.update(all_labels, all_preds)
        out = []
        for m, (name, value) in zip(merged.metrics, merged.results()):
            if isinstance(m, AverageLoss):
                value = _average_loss(losses, counts)
            out.append((name, value))
        return out


def _average_loss(losses: np.ndarray, counts: np.ndarray) -> float:
    """Mean over batches of the global batch loss; ``losses`` rows are ``(loss * n, n)`` of
    each rank's batches in rank order, ``counts`` the batches per rank."""
    if not losses.shape[0]:
        return float("nan")
    if len(set(counts.tolist())) == 1:  # every rank saw every batch: sum the shares per batch
        per = losses.reshape(len(counts), int(counts[0]), 2).sum(axis=0)
        per = per[per[:, 1] > 0]
        return float(np.mean(per[:, 0] / per[:, 1]))
    return float(losses[:, 0].sum() / max(losses[:, 1].sum(), 1.0))
