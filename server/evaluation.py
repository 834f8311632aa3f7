"""Quality figures of predictions against labels: AUC and log loss (vectorised)."""

from __future__ import annotations

import numpy as np


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve over all label columns flattened; ties count one half.

    Returns NaN when only one class is present.
    """
    y = np.asarray(labels, dtype=np.float64).reshape(-1) > 0.5
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    # Average ranks over ties (1-based).
    first = np.r_[True, sorted_s[1:] != sorted_s[:-1]]
    group = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    ends = np.r_[starts[1:], s.size]
    avg_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(s.size)
    ranks[order] = avg_rank[group]
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def logloss(labels: np.ndarray, scores: np.ndarray, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of probabilities ``scores`` against 0/1 ``labels``."""
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    p = np.clip(np.asarray(scores, dtype=np.float64).reshape(-1), eps, 1 - eps)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))
