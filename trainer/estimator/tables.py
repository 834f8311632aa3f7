"""The embedding table behind a feature-column group: the trainer's
:class:`~tierserve.trainer.embedding.EmbeddingTable` plus a read-only lookup.

Training looks ids up with :meth:`EmbeddingTable.forward` (a new id gets its initial vector,
a pure function of the seed and the key).  Evaluation and prediction use :meth:`lookup`,
which adds nothing: an id never trained reads zeros, exactly what the parameter server
returns for a key it does not hold (``default_value_for_each_table`` 0), so an exported model
serves the values ``Estimator.predict`` gives.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from tierserve.model.batch import SparseInput
from tierserve.model.combine import combine

from ..embedding import EmbeddingTable, key_uniform


def _ndtri(xp: Any, p: Any) -> Any:
    """The standard normal quantile of ``p`` in (0, 1), elementwise (Acklam's rational
    approximation, relative error below 1.2e-9)."""
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
         1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
         6.680131188771972e01, -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
         -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00,
         3.754408661907416e00)
    p = p.astype(xp.float64)
    q = p - 0.5
    r = q * q
    central = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / (
        ((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0)
    t = xp.sqrt(-2.0 * xp.log(xp.minimum(p, 1.0 - p)))
    tail = (((((c[0] * t + c[1]) * t + c[2]) * t + c[3]) * t + c[4]) * t + c[5]) / (
        (((d[0] * t + d[1]) * t + d[2]) * t + d[3]) * t + 1.0)
    tail = xp.where(p < 0.5, tail, -tail)
    return xp.where(xp.abs(q) <= 0.47575, central, tail)


#: Standard normal CDF at -2 and 2: the range a +-2 sigma truncated normal draws from.
_PHI_MINUS_2 = 0.022750131948179195
_PHI_PLUS_2 = 0.9772498680518208


def truncated_normal_rows(keys: Any, seed: int, dim: int, stddev: float, xp: Any = np) -> Any:
    """``[len(keys), dim]`` float32 draws of a normal of ``stddev`` truncated at two standard
    deviations (``tf.compat.v1.truncated_normal_initializer``'s distribution), a function of
    ``(seed, key)`` alone: the key's uniforms through the truncated normal's quantile."""
    u = key_uniform(keys, seed, dim).astype(xp.float64)
    p = _PHI_MINUS_2 + (u + 1.0) * 0.5 * (_PHI_PLUS_2 - _PHI_MINUS_2)
    return (_ndtri(xp, p) * stddev).astype(xp.float32)


class ColumnTable(EmbeddingTable):
    """An :class:`EmbeddingTable` whose new rows start as TensorFlow's embedding_column
    initializer draws them: a normal of standard deviation ``1/sqrt(dimension)`` truncated at
    two standard deviations; ``init_scale`` instead gives rows uniform in
    ``[-init_scale, init_scale]`` (0: zeros, a linear model's weights)."""

    def __init__(self, name: str, dim: int, rows: int, optimizer: Any, combiner: str,
                 seed: int, init_scale: float | None = None, xp: Any = np) -> None:
        copies = 4  # generous: every optimizer here keeps at most 2 state copies (+ prev_time)
        workspace = max(rows, 1024) * (1 + copies) * 4 * dim / float(1 << 20) * 1.25
        super().__init__("DistributedSlotSparseEmbeddingHash", dim, workspace, optimizer,
                         combiner=combiner, name=name, seed=seed, xp=xp)
        self.init_scale = None if init_scale is None else float(init_scale)
        self._bound = 0.0 if init_scale is None else float(init_scale)
        self.workspace_rows = rows

    def initial_rows(self, keys: Any) -> Any:
        if self.init_scale is None:
            return truncated_normal_rows(keys, self.seed, self.dim,
                                         1.0 / math.sqrt(self.dim), self.xp)
        if self.init_scale == 0.0:
            return self.xp.zeros((keys.shape[0], self.dim), dtype=self.xp.float32)
        return super().initial_rows(keys)

    #: What a key the table does not hold reads in :meth:`lookup`: zeros (False, what the
    #: served model's parameter server returns), or its initial vector (True, what
    #: TensorFlow's embedding variable, whose every row exists from the start, holds).
    absent_reads_initial = False

    def lookup(self, sparse: SparseInput, combiner: str | None = None) -> Any:
        """Pooled vectors like :meth:`forward`, adding no key: absent keys read zeros (see
        :attr:`absent_reads_initial`)."""
        xp = self.xp
        keys = xp.asarray(np.asarray(sparse.keys, dtype=np.int64))
        offsets = xp.asarray(np.asarray(sparse.row_offsets, dtype=np.int64))
        rows = self._index.lookup(keys)  # the base class's key index (read only)
        hit = rows >= 0
        emb = (self.initial_rows(keys) if self.absent_reads_initial
               else xp.zeros((keys.shape[0], self.dim), dtype=xp.float32))
        emb[hit] = xp.take(self._values, rows[hit], axis=0)
        return combine(emb, offsets, int(sparse.slot_num), combiner or self.combiner)

    def renorm(self, max_norm: float) -> None:
        """Scale rows whose L2 norm exceeds ``max_norm`` back to it (PyTorch's
        ``nn.Embedding(max_norm)``): what ``embedding_column(max_norm=...)`` does here."""
        v = self.values
        if v.shape[0] == 0:
            return
        norms = self.xp.sqrt((v * v).sum(axis=1))
        over = norms > max_norm
        if bool(over.any()):
            v[over] *= (max_norm / norms[over])[:, None].astype(v.dtype)
