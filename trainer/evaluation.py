"""Quality figures of predictions against labels: AUC (the trainer's) and log loss."""

from __future__ import annotations

import numpy as np


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """ROC AUC over all label columns flattened (the trainer's exact, tie-aware AUC); NaN when
    only one class is present."""
    from tierserve.trainer.metrics import auc_score

    return float(auc_score(np.asarray(labels).reshape(-1), np.asarray(scores).reshape(-1)))


def logloss(labels: np.ndarray, scores: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of probabilities ``scores`` against 0/1 ``labels``."""
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    p = np.clip(np.asarray(scores, dtype=np.float64).reshape(-1), eps, 1 - eps)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))
