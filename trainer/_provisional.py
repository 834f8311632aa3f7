"""Stand-ins used until the embedding engineer's table, scheduler and metrics land."""

from __future__ import annotations

import numpy as np

from tierserve.ps.sparse_file import SparseTable

from .embedding.key_index import KeyIndex
from .optimizers import make_optimizer


class ProvisionalTable:
    def __init__(self, dim, opt_params, xp=np, seed=0):
        self.xp, self.dim = xp, dim
        self.index = KeyIndex(xp)
        self.values = xp.zeros((1024, dim), dtype=np.float32)
        self.opt = make_optimizer(opt_params)
        self.state = self.opt.init_state((1024, dim), xp)
        self.rng = np.random.default_rng(seed)
        self._ctx = None

    def _grow(self, n):
        xp = self.xp
        cap = self.values.shape[0]
        if n <= cap:
            return
        new = max(n, 2 * cap)
        v = xp.zeros((new, self.dim), np.float32)
        v[:cap] = self.values
        self.values = v
        for k, a in self.state.items():
            b = self.opt.init_state((new, self.dim), xp)[k]
            b[:cap] = a
            self.state[k] = b

    def forward(self, sparse, combiner):
        xp = self.xp
        keys = xp.asarray(sparse.keys, dtype=np.int64)
        rows, new_keys, _ = self.index.lookup_or_insert(keys)
        n = len(self.index)
        self._grow(n)
        if len(new_keys):
            first = n - len(new_keys)
            self.values[first:n] = xp.asarray(
                self.rng.uniform(-0.05, 0.05, (len(new_keys), self.dim)).astype(np.float32))
        offsets = xp.asarray(sparse.row_offsets)
        counts = offsets[1:] - offsets[:-1]
        nrows = len(counts)
        seg = xp.repeat(xp.arange(nrows), counts)
        vals = self.values[rows]
        out = xp.zeros((nrows, self.dim), np.float32)
        xp.add.at(out, seg, vals)
        scale = None
        if combiner == "mean":
            scale = 1.0 / xp.maximum(counts, 1).astype(np.float32)
            out *= scale[:, None]
        self._ctx = (rows, seg, scale, sparse.slot_num)
        return out.reshape(-1, sparse.slot_num, self.dim)

    def backward(self, grad, lr, step):
        xp = self.xp
        rows, seg, scale, slot_num = self._ctx
        g = grad.reshape(-1, self.dim)
        if scale is not None:
            g = g * scale[:, None]
        per_key = g[seg]
        uniq, inv = xp.unique(rows, return_inverse=True)
        summed = xp.zeros((len(uniq), self.dim), np.float32)
        xp.add.at(summed, inv.reshape(-1), per_key)
        self.opt.update_sparse(self.values, uniq, summed, self.state, lr, step,
                               num_rows=len(self.index))

    def export(self):
        n = len(self.index)
        return SparseTable(np.asarray(self.index.keys).copy(), np.asarray(self.values[:n]).copy())

    def load(self, table):
        self.index = KeyIndex(self.xp)
        self.index.insert(table.keys)
        self.values = self.xp.zeros((max(1024, len(table)), self.dim), np.float32)
        self.values[: len(table)] = table.embeddings
        self.state = self.opt.init_state(self.values.shape, self.xp)


class ProvisionalScheduler:
    def __init__(self, base_lr, warmup_steps=1, decay_start=0, decay_steps=1, decay_power=2.0,
                 end_lr=0.0):
        self.base_lr, self.warmup, self.decay_start = base_lr, warmup_steps, decay_start
        self.decay_steps, self.power, self.end_lr = decay_steps, decay_power, end_lr
        self.step = 0

    def get_next(self):
        self.step += 1
        s = self.step
        if s <= self.warmup:
            return s * self.base_lr / max(self.warmup, 1)
        if self.decay_start:
            if s <= self.decay_start:
                return self.base_lr
            if s <= self.decay_start + self.decay_steps:
                f = 1 - (s - self.decay_start) / self.decay_steps
                return (self.base_lr - self.end_lr) * f**self.power + self.end_lr
            return self.end_lr
        return self.base_lr


import enum  # noqa: E402


class MetricsType(enum.Enum):
    AUC = "AUC"
    AverageLoss = "AverageLoss"
    HitRate = "HitRate"


class Embedding_t(enum.Enum):  # noqa: N801
    DistributedSlotSparseEmbeddingHash = "DistributedSlotSparseEmbeddingHash"
    LocalizedSlotSparseEmbeddingHash = "LocalizedSlotSparseEmbeddingHash"
    LocalizedSlotSparseEmbeddingOneHot = "LocalizedSlotSparseEmbeddingOneHot"
    HybridSparseEmbedding = "HybridSparseEmbedding"
