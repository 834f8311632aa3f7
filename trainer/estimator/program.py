"""One mode's compiled network: what a ``model_fn`` built, run on batches.

A :class:`Program` turns raw feature batches into the graph's inputs (dense features, CSR
keys per table), looks the keys up, runs the trainer's
:class:`~tierserve.model.network.DenseNetwork` forward and, when training, backward, and
applies each train op's optimizer to the variables it owns.  Variables live in the
Estimator's :class:`~.variables.VariableStore`, so the programs of all modes share them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.model.batch import SparseInput
from tierserve.model.device import to_numpy, to_xp
from tierserve.model.network import DenseNetwork
from tierserve.trainer.graph.tensors import DENSE, LABEL, Graph, SparseGroup, WeightedInput

from .optimizers import GradientDescentOptimizer, TrainOp
from .variables import TableInfo, VariableStore


def _rows(value: Any) -> int:
    if isinstance(value, np.ndarray):
        return int(value.shape[0]) if value.ndim else 1
    if isinstance(value, (list, tuple)):
        return len(value)
    return int(np.shape(value)[0]) if np.ndim(value) else 1


def batch_size_of(features: dict, labels: Any) -> int:
    """Examples in a batch: the labels' rows, else the first feature's."""
    if labels is not None:
        return _rows(labels)
    for v in features.values():
        return _rows(v)
    raise InvalidInputError("the input_fn gave no features")


def group_keys(group: SparseGroup, features: dict, batch_size: int,
               cache: dict | None = None) -> SparseInput:
    """The CSR keys of one table for a batch: a slot per column, ids plus the slot's offset,
    row ``sample * slot_num + slot`` (HugeCTR's layout).  ``cache`` (per batch) keeps each
    column's ids for the other tables that read the same column (wide and deep parts)."""
    if cache is None:
        cache = {}
    ids = []
    for c in group.columns:
        got = cache.get(id(c))
        if got is None:
            got = cache[id(c)] = c.ids(features)
        ids.append(got)
    for c, i in zip(group.columns, ids):
        if i.batch_size != batch_size:
            raise InvalidInputError(f"feature column {c.name!r} has {i.batch_size} examples, "
                                    f"the batch {batch_size}")
    s = len(ids)
    if all(i.offsets is None for i in ids):
        keys = np.stack([i.values + off for i, off in zip(ids, group.offsets)], axis=1)
        return SparseInput(keys.reshape(-1), np.arange(batch_size * s + 1, dtype=np.int64), s)
    counts = np.stack([i.counts() for i in ids], axis=1)  # [B, S]
    offsets = np.concatenate([[0], np.cumsum(counts.reshape(-1))]).astype(np.int64)
    values = np.concatenate([i.values + off for i, off in zip(ids, group.offsets)])
    rows = np.concatenate([i.row_of_value() * s + slot for slot, i in enumerate(ids)])
    order = np.argsort(rows, kind="stable")
    return SparseInput(values[order].astype(np.int64), offsets, s)


@dataclass
class StepResult:
    """A step's graph tensors (host arrays) and its loss (None without labels)."""

    tensors: dict[str, Any]
    loss: float | None
    batch_size: int


class Program:
    """The compiled graph of one mode (see the module docstring)."""

    def __init__(self, graph: Graph, store: VariableStore, train_ops: list[TrainOp],
                 loss: Any, label_dim: int | None) -> None:
        self.graph = graph
        self.store = store
        self.train_ops = train_ops
        self.loss = loss
        self.label_dim = label_dim
        shapes: dict[str, tuple[int, ...]] = {DENSE: (graph.dense_width,)}
        if label_dim is not None:
            shapes[LABEL] = (label_dim,)
        for group in graph.groups:
            shapes[group.table] = (group.slot_num, group.dim)
        for w in graph.weighted:
            shapes[w.name] = (w.dim,)
        grad_sources = {g.table for g in graph.groups} | {w.name for w in graph.weighted}
        self.network = DenseNetwork(graph.layers, shapes, grad_sources)
        for i, layer in enumerate(self.network.layers):
            if hasattr(layer, "set_seed"):
                layer.set_seed(store.seed + 7919 * (i + 1))
        self._bind_variables()
        self._bind_tables()
        self.loss_scales = dict(loss.terms) if loss is not None else {}
        reductions = {layer.get("reduction", "mean") for layer in graph.layers
                      if isinstance(layer.get("top"), str) and layer["top"] in self.loss_scales}
        #: the loss sums its examples' losses (``Reduction.SUM``): a batch's loss divided by
        #: its size is the per-example loss
        self.loss_is_sum = reductions == {"sum"}

    # -- variables -----------------------------------------------------------------------

    def _owner(self, name: str) -> TrainOp | None:
        for op in self.train_ops:
            if op.owns(name):
                return op
        return None

    def _bind_variables(self) -> None:
        g, store = self.graph, self.store
        rng = np.random.default_rng(store.seed)
        init = self.network.init_params(rng)
        self.params: list[list[np.ndarray]] = []
        self.states: list[list[np.ndarray]] = []
        self.param_names: list[list[str]] = []
        self.updates: list[tuple[int, int, TrainOp, dict]] = []
        for i, layer in enumerate(self.network.layers):
            names = g.param_names.get(layer.name) or [
                f"{layer.name}/param_{j}" for j in range(len(init[i]))]
            arrays = []
            for j, (name, value) in enumerate(zip(names, init[i])):
                if name in g.initial:
                    value = np.asarray(g.initial[name](tuple(value.shape)), np.float32)
                    if value.shape != init[i][j].shape:
                        raise ConfigError(f"the initializer of {name!r} returned shape "
                                          f"{list(value.shape)}, expected "
                                          f"{list(init[i][j].shape)}")
                fixed = g.frozen.get(name)
                if fixed is not None:
                    value = np.broadcast_to(np.asarray(fixed, np.float32), value.shape)
                arr = store.variable(name, value)
                arrays.append(arr)
                op = None if name in g.frozen else self._owner(name)
                if op is not None:
                    self.updates.append((i, j, op, store.optimizer_state(name, op.optimizer.impl)))
            self.params.append(arrays)
            self.param_names.append(list(names))
            snames = g.state_names.get(layer.name) or [
                f"{layer.name}/state_{j}" for j in range(len(layer.state_shapes()))]
            self.states.append([store.variable(n, s, "state")
                                for n, s in zip(snames, layer.init_state())])

    def _bind_tables(self) -> None:
        g, store = self.graph, self.store
        self.tables = []
        for group in g.groups + g.weighted:
            weighted = isinstance(group, WeightedInput)
            name = group.table
            op = self._owner(group.display_name if weighted else (group.display_names or [name])[0])
            trains = op is not None and (weighted or group.trainable)
            opt = (op.optimizer if op is not None else GradientDescentOptimizer(0.1))
            cols = [group.column] if weighted else group.columns
            info = TableInfo(dim=group.dim, combiner=group.combiner,
                             columns=[c.name for c in cols],
                             offsets=[0] if weighted else list(group.offsets),
                             buckets=[c.num_buckets for c in cols],
                             display=[getattr(group, "display_name", name)] if weighted
                             else list(group.display_names))
            scale = (0.0 if getattr(group, "zero_init", False) else None) if weighted else (
                group.init_scale)
            xp = np
            if not weighted and "gpu" in group.device.lower():
                xp = _gpu_xp(group.device)
            store.table(name, info, opt.params(for_table=True), trains, scale,
                        getattr(group, "init", None), xp)
            # not trained here (another mode, or trainable=False): this program just never
            # applies a gradient to it; freezing the shared table would stop other programs
            self.tables.append((group, name, op if trains else None))

    # -- feeding -------------------------------------------------------------------------

    def dense_input(self, features: dict, batch_size: int) -> np.ndarray:
        pieces = self.graph.dense_pieces
        if not pieces:
            return np.zeros((batch_size, 0), np.float32)
        parts = []
        for p in pieces:
            x = p.column.dense(features)
            if x.shape[0] != batch_size:
                raise InvalidInputError(f"feature column {p.column.name!r} has {x.shape[0]} "
                                        f"examples, the batch {batch_size}")
            parts.append(x)
        return np.ascontiguousarray(np.concatenate(parts, axis=1), dtype=np.float32)

    def feed(self, features: dict, labels: Any, training: bool) -> tuple[dict, list, int]:
        b = batch_size_of(features, labels)
        tensors: dict[str, Any] = {DENSE: self.dense_input(features, b)}
        if labels is not None and self.label_dim is not None:
            lab = np.asarray(labels, dtype=np.float32).reshape(b, -1)
            if lab.shape[1] != self.label_dim:
                raise InvalidInputError(f"labels have {lab.shape[1]} values per example, the "
                                        f"model expects {self.label_dim}")
            tensors[LABEL] = lab
        saved = []
        cache: dict[int, Any] = {}
        for group, name, _op in self.tables:
            table = self.store.tables[name]  # the store may have rebuilt it (restore, optimizer)
            if isinstance(group, WeightedInput):
                out, ctx = self._weighted_forward(group, table, features, b, training)
                tensors[group.name] = out
                saved.append(ctx)
                continue
            sparse = group_keys(group, features, b, cache)
            if training:
                out = table.forward(sparse, group.combiner, training=True)
            else:
                out = table.lookup(sparse, group.combiner)
            tensors[group.table] = to_numpy(out)
            saved.append(None)
        return tensors, saved, b

    def _weighted_forward(self, w: WeightedInput, table, features, b, training):
        ids = w.column.ids(features)
        n = len(ids.values)
        out = np.zeros((b, w.dim), np.float32)
        if n == 0 and not getattr(table, "collective", False):  # sharded: join the exchange
            return out, None
        sparse = SparseInput(ids.values.astype(np.int64), np.arange(n + 1, dtype=np.int64), 1)
        emb = to_numpy(table.forward(sparse, "sum", training=True) if training
                       else table.lookup(sparse, "sum")).reshape(n, w.dim)
        rows = ids.row_of_value()
        weights = ids.weights if ids.weights is not None else np.ones(n, np.float32)
        np.add.at(out, rows, emb * weights[:, None])
        scale = None
        if w.combiner == "mean":
            tot = np.bincount(rows, weights=weights, minlength=b).astype(np.float32)
            scale = np.where(tot != 0, 1.0 / np.where(tot != 0, tot, 1), 0).astype(np.float32)
            out *= scale[:, None]
        return out, (rows, weights, scale, n)

    # -- running -------------------------------------------------------------------------

    def run(self, features: dict, labels: Any, training: bool) -> StepResult:
        """Forward (and, training, backward and the updates) of one batch."""
        tensors, saved, b = self.feed(features, labels, training)
        with_loss = LABEL in tensors and bool(self.loss_scales)
        if training and not with_loss:
            raise InvalidInputError("training needs labels: the input_fn gave none")
        ctxs = self.network.forward(np, tensors, self.params, self.states, training,
                                    with_loss=with_loss)
        loss = None
        if with_loss:
            loss = sum(s * float(tensors[t]) for t, s in self.loss_scales.items())
        if training:
            loss = self._backward(ctxs, tensors, saved, loss, b)
        return StepResult(tensors, loss, b)

    def _backward(self, ctxs, tensors, saved, loss: float | None = None,
                  n: int = 0) -> float | None:
        """Apply one step's gradients; returns the step's loss (the global batch's when the
        store averages gradients over MPI ranks)."""
        param_grads, input_grads = self.network.backward(np, ctxs, self.params,
                                                         self.loss_scales)
        if self.store.reduce_step is not None:
            loss = self.store.reduce_step(loss, param_grads, input_grads, n)
        step = self.store.global_step + 1
        for i, j, op, st in self.updates:
            g = param_grads[i][j]
            if g is None:
                continue
            op.optimizer.impl.update_dense(self.params[i][j], g.astype(np.float32, copy=False),
                                           st, op.optimizer.lr(step - 1), step)
        for (group, name, op), ctx in zip(self.tables, saved):
            table = self.store.tables[name]
            if op is None:
                table._saved = None  # frozen: drop what forward kept for backward
                continue
            lr = op.optimizer.lr(step - 1)
            if isinstance(group, WeightedInput):
                g = input_grads.get(group.name)
                if g is None or ctx is None:
                    continue
                rows, weights, scale, n = ctx
                gr = g[rows] * weights[:, None]
                if scale is not None:
                    gr *= scale[rows][:, None]
                table.backward(to_xp(table.xp, gr.reshape(n, 1, group.dim).astype(np.float32)),
                               lr, step)
                continue
            g = input_grads.get(group.table)
            if g is None:
                table._saved = None
                continue
            table.backward(to_xp(table.xp, np.ascontiguousarray(g, dtype=np.float32)), lr, step)
            if group.max_norm is not None:
                table.renorm(group.max_norm)
        return loss

    def learning_rates(self) -> dict[str, float]:
        step = self.store.global_step
        out = {}
        for k, op in enumerate(self.train_ops):
            out["learning_rate" if len(self.train_ops) == 1 else
                f"learning_rate/{op.var_list[0].rstrip('/') if op.var_list else k}"] = (
                op.optimizer.lr(step))
        return out


def _gpu_xp(device: str):
    from tierserve.model.device import select_xp

    digits = "".join(ch for ch in device.split(":")[-1] if ch.isdigit())
    xp = select_xp([int(digits or 0)], warn=False)
    if xp is np:
        from tierserve.core.compat import warn_once

        warn_once("emb_device", f"{device!r}: no GPU is visible to cupy; the table stays in "
                  "host memory", stacklevel=6)
    return xp
