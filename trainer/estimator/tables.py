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

from ..embedding import EmbeddingTable


class ColumnTable(EmbeddingTable):
    """An :class:`EmbeddingTable` with initial vectors uniform in ``[-scale, scale]``
    (default: TensorFlow's embedding_column standard deviation, ``1/sqrt(dimension)``)."""

    def __init__(self, name: str, dim: int, rows: int, optimizer: Any, combiner: str,
                 seed: int, init_scale: float | None = None, xp: Any = np) -> None:
        copies = 4  # generous: every optimizer here keeps at most 2 state copies (+ prev_time)
        workspace = max(rows, 1024) * (1 + copies) * 4 * dim / float(1 << 20) * 1.25
        super().__init__("DistributedSlotSparseEmbeddingHash", dim, workspace, optimizer,
                         combiner=combiner, name=name, seed=seed, xp=xp)
        scale = math.sqrt(3.0 / dim) if init_scale is None else float(init_scale)
        self._bound = scale  # the base class draws new rows as key_uniform * _bound
        self.workspace_rows = rows

    def lookup(self, sparse: SparseInput, combiner: str | None = None) -> Any:
        """Pooled vectors like :meth:`forward`, adding no key: absent keys read zeros."""
        xp = self.xp
        keys = xp.asarray(np.asarray(sparse.keys, dtype=np.int64))
        offsets = xp.asarray(np.asarray(sparse.row_offsets, dtype=np.int64))
        rows = self._index.lookup(keys)  # the base class's key index (read only)
        hit = rows >= 0
        emb = xp.zeros((keys.shape[0], self.dim), dtype=xp.float32)
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
