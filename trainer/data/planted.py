"""The hidden model behind generated labels, and the AUC used to measure it.

Each label ``j`` of a sample has the logit ``bias + sum_s mean_k w_j(s, k) + v_j . z``: a hidden
weight per (slot, key) drawn from a normal distribution by hashing (so vocabularies of any size
cost no memory), averaged over the keys of a multi-hot slot, plus a linear term on the latent
dense variables ``z`` (standard normal).  The dense features written to files are
``log(1 + count)`` with ``count = floor(expm1(max(mu + sigma * z, 0)))``, a monotone function of
``z``, so the signal is learnable from them.  Labels are Bernoulli(sigmoid(logit)).
"""

from __future__ import annotations

import numpy as np

from tierserve.ps.partition import splitmix64 as mix64

#: Spread (standard deviation) of the logit from the keys and from the dense features; together
#: they put the Bayes-optimal AUC of the labels near 0.86.
KEY_LOGIT_STD = 1.8
DENSE_LOGIT_STD = 1.5
BIAS = -1.0


def _unit(h: np.ndarray) -> np.ndarray:
    """Uniform (0, 1) doubles from uint64 hashes."""
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def hashed_normal(h: np.ndarray) -> np.ndarray:
    """A standard normal deviate per uint64 hash (Box-Muller on two derived uniforms)."""
    u1, u2 = _unit(h), _unit(mix64(h))
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


class PlantedModel:
    """The generator's hidden model for ``label_dim`` labels, ``dense_dim`` and ``num_slot``."""

    def __init__(self, seed: int, label_dim: int, dense_dim: int, num_slot: int) -> None:
        self.label_dim, self.dense_dim, self.num_slot = label_dim, dense_dim, num_slot
        rng = np.random.default_rng([seed, 0x5EED])
        key_std = KEY_LOGIT_STD if dense_dim else KEY_LOGIT_STD + DENSE_LOGIT_STD
        dense_std = DENSE_LOGIT_STD if num_slot else KEY_LOGIT_STD + DENSE_LOGIT_STD
        self.key_scale = key_std / np.sqrt(max(num_slot, 1))
        v = rng.standard_normal((dense_dim, label_dim))
        norms = np.linalg.norm(v, axis=0, keepdims=True)
        self.dense_weights = v / np.where(norms > 0, norms, 1.0) * dense_std
        self.dense_mu = rng.uniform(1.0, 4.0, dense_dim)
        self.dense_sigma = rng.uniform(0.5, 1.5, dense_dim)
        self.salts = mix64(rng.integers(0, 2**63, (num_slot, label_dim), dtype=np.uint64))

    def dense_counts(self, z: np.ndarray) -> np.ndarray:
        """Integer counts (int32) for latent dense variables ``z [n, dense_dim]``."""
        x = np.maximum(self.dense_mu + self.dense_sigma * z, 0.0)
        return np.floor(np.expm1(x)).astype(np.int32)

    def key_weights(self, slot_of_key: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Hidden weights ``[nnz, label_dim]`` of slot-local ``keys``."""
        h = mix64(keys.astype(np.uint64))
        out = np.empty((len(keys), self.label_dim))
        for j in range(self.label_dim):
            out[:, j] = hashed_normal(h ^ self.salts[slot_of_key, j])
        return out * self.key_scale

    def logits(self, z: np.ndarray, keys: np.ndarray, row_offsets: np.ndarray) -> np.ndarray:
        """Logits ``[n, label_dim]`` of samples with latent dense ``z`` and slot-local keys."""
        n, s = z.shape[0], self.num_slot
        out = np.full((n, self.label_dim), BIAS) + z @ self.dense_weights
        if s and len(keys):
            counts = np.diff(row_offsets)
            rows = np.repeat(np.arange(n * s), counts)
            w = self.key_weights(rows % s, keys)
            for j in range(self.label_dim):
                sums = np.bincount(rows, weights=w[:, j], minlength=n * s)
                out[:, j] += (sums / np.maximum(counts, 1)).reshape(n, s).sum(axis=1)
        return out


def auc_score(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve of binary ``labels`` ranked by ``scores`` (ties count half)."""
    labels = np.asarray(labels).ravel() > 0.5
    scores = np.asarray(scores, dtype=np.float64).ravel()
    pos = int(labels.sum())
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # average ranks (1-based) over runs of equal scores
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], len(scores)]
    avg = (starts + ends + 1) / 2.0
    ranks = np.empty(len(scores))
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))
