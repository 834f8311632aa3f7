"""The training engine under HugeCTR's ``Model``: the embedding tables, the dense network's
parameters and state, the optimizers' states, and one step over a batch.

A training step reads a :class:`~tierserve.model.batch.Batch`, looks the sparse inputs up in
the embedding tables, runs the dense network forward and backward
(:class:`~tierserve.model.network.DenseNetwork`), then updates the dense parameters with the
dense optimizer and each table with its own sparse optimizer.  Everything runs on ``xp``
(numpy, or cupy when the devices name a visible GPU); with mixed precision on a GPU the
network computes in float16 and the loss is scaled.  Data readers, the graph's layer
descriptions, metrics and files are the facade's (:mod:`tierserve.trainer.hugectr.model`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError
from tierserve.model.device import is_gpu, select_xp, to_numpy, to_xp
from tierserve.model.graph_json import Graph
from tierserve.model.inference_graph import graph_inputs, input_shapes, label_layout
from tierserve.model.network import DenseNetwork
from tierserve.trainer.optimizers import OptParamsPy, make_optimizer


class TrainingEngine:
    """What trains: ``build`` it from a checked graph, then ``train_on`` batches.

    ``lr`` is the learning rate of the next step, ``step`` the updates made so far, ``loss``
    the last training step's (regularization included); ``dense_frozen`` stops the dense
    updates; ``last_tensors`` holds the tensors of the last ``"Train"`` and ``"Evaluate"``
    step.  ``dist`` (set by ``build``) are the distributed hooks under ``mpiexec``.
    """

    def __init__(self, lr: float) -> None:
        self.xp = np
        self.lr = float(lr)
        self.step = 0
        self.loss = float("nan")
        self.dense_frozen = False
        self.last_tensors: dict[str, dict[str, Any]] = {}  # check_out_tensor, by Tensor_t
        self.dist = None

    # -- building ------------------------------------------------------------------------------

    def build(self, graph: Graph, dense_layers: list[dict[str, Any]], solver: Any,
              opt_params: OptParamsPy, dist: Any,
              make_table: Callable[[Any, Any], Any],
              loss_names: list[str] | None = None,
              loss_weights: list[float] | None = None) -> None:
        """Pick the device, build the dense network from ``dense_layers`` (seeded by
        ``solver.seed``), initialise its parameters and optimizer states, and create each
        embedding table with ``make_table(spec, xp)``.  ``loss_names`` / ``loss_weights``
        weight the losses of a multi-task model (see :meth:`loss_weights`)."""
        self.dist = dist
        self.xp = xp = select_xp(dist.devices if dist else solver.vvgpu)
        self.mixed = bool(solver.use_mixed_precision) and is_gpu(xp)
        if solver.use_mixed_precision and not self.mixed:
            warnings.warn("use_mixed_precision: the CPU computes in float32 (scaler ignored)",
                          stacklevel=3)
        self.compute_dtype = np.float16 if self.mixed else np.float32
        self.loss_scale = float(solver.scaler) if self.mixed else 1.0
        data, self.embedding_specs = graph_inputs(graph)
        self.label_names, self.label_dims = label_layout(data)
        self.dense_name = data["dense"]["top"]
        self.dense_dim = int(data["dense"]["dense_dim"])
        self.sparse_names = [s["top"] for s in data.get("sparse", [])]
        self.network = DenseNetwork(
            dense_layers, input_shapes(graph),
            grad_sources={s.name for s in self.embedding_specs},
        )
        if not self.network.loss_layers:
            raise ConfigError("the model has no loss layer (BinaryCrossEntropyLoss, ...)")
        self.loss_scales = self.loss_weights(loss_names, loss_weights)
        for i, layer in enumerate(self.network.layers):
            if hasattr(layer, "set_seed"):
                layer.set_seed(solver.seed + 7919 * (i + 1))
        rng = np.random.default_rng(solver.seed)
        self.params = [[to_xp(xp, p, np.float32) for p in ps]
                       for ps in self.network.init_params(rng)]
        self.states = [[to_xp(xp, s, np.float32) for s in ss] for ss in self.network.init_state()]
        self.optimizer = make_optimizer(opt_params)
        self.opt_states = [[self.optimizer.init_state(tuple(p.shape), xp) for p in ps]
                           for ps in self.params]
        if xp is np:
            self._column_major_params()
        self.tables = [make_table(spec, xp) for spec in self.embedding_specs]

    def loss_weights(self, names, weights) -> dict[str, float]:
        """Each loss layer's weight by its top: ``weights[i]`` for the losses whose top, label
        or layer name is ``names[i]``, 1 for the others."""
        losses = self.network.loss_layers
        scales = {layer.top[0]: 1.0 for layer in losses}
        if names is None and weights is None:
            return scales
        names, weights = list(names or []), list(weights or [])
        if len(names) != len(weights):
            raise ConfigError(f"compile: {len(names)} loss_names but {len(weights)} loss_weights")
        for name, w in zip(names, weights):
            match = [layer for layer in losses if name in (layer.top[0], layer.label_name,
                                                           layer.name)]
            if not match:
                raise ConfigError(f"compile: no loss layer for {name!r} "
                                  f"(losses: {[layer.top[0] for layer in losses]})")
            for layer in match:
                scales[layer.top[0]] = float(w)
        return scales

    def _column_major_params(self) -> None:
        """Store the parameters layers name in ``column_major_params`` (and their optimizer
        state, so updates run over matching memory) in Fortran order.  Values and shapes
        are unchanged; loading replaces values in place, so the layout stays."""
        for i, layer in enumerate(self.network.layers):
            for j in layer.column_major_params:
                self.params[i][j] = np.asfortranarray(self.params[i][j])
                state = self.opt_states[i][j]
                for name in state:
                    state[name] = np.asfortranarray(state[name])

    # -- one step ------------------------------------------------------------------------------

    def _tensors(self, batch) -> dict[str, Any]:
        xp = self.xp
        tensors: dict[str, Any] = {}
        label = to_xp(xp, batch.label, np.float32)
        start = 0
        for name, dim in zip(self.label_names, self.label_dims):
            tensors[name] = label[:, start : start + dim]
            start += dim
        tensors[self.dense_name] = to_xp(xp, batch.dense, self.compute_dtype)
        return tensors

    def _lookup(self, batch, tensors, training: bool = False) -> None:
        for spec, table in zip(self.embedding_specs, self.tables):
            sparse = batch.sparse[self.sparse_names.index(spec.sparse_input)]
            out = table.forward(sparse, spec.combiner, training=training)
            tensors[spec.name] = out.astype(self.compute_dtype, copy=False)

    def _params_for_compute(self):
        if not self.mixed:
            return self.params
        return [[p.astype(np.float16) for p in ps] for ps in self.params]

    def _loss_value(self, tensors) -> float:
        total = 0.0
        for layer in self.network.loss_layers:
            total += self.loss_scales[layer.top[0]] * float(tensors[layer.top[0]])
        return total

    def _regularizers(self) -> list[tuple[str, float]]:
        return [(layer.regularizer, layer.reg_lambda) for layer in self.network.loss_layers
                if layer.regularizer and layer.reg_lambda]

    def train_on(self, batch) -> None:
        """One iteration on ``batch`` at ``lr``: forward, backward, and the updates."""
        xp = self.xp
        tensors = self._tensors(batch)
        self._lookup(batch, tensors, training=True)
        params = self._params_for_compute()
        ctxs = self.network.forward(xp, tensors, params, self.states, True,
                                    loss_dtype=np.float32 if self.mixed else None)
        self.last_tensors["Train"] = tensors
        loss = self._loss_value(tensors)
        scales = {k: v * self.loss_scale for k, v in self.loss_scales.items()}
        param_grads, input_grads = self.network.backward(
            xp, ctxs, params, scales, grad_dtype=np.float16 if self.mixed else None)
        batch_size = batch.batch_size
        if self.dist is not None:  # data-parallel: the global batch's gradients and loss
            loss, batch_size = self.dist.reduce_step(loss, param_grads, input_grads, batch_size)
        self.step += 1
        step, lr = self.step, self.lr
        inv = 1.0 / self.loss_scale
        if self.mixed:
            finite = all(bool(xp.isfinite(g).all()) for gs in param_grads for g in gs
                         if g is not None)
            finite = finite and all(bool(xp.isfinite(g).all()) for g in input_grads.values())
            if not finite:  # loss-scale overflow: skip this update, as HugeCTR does
                self.loss = loss
                return
        regs = self._regularizers()
        for reg, lam in regs:
            for ps in self.params:
                for p in ps:
                    loss += lam / batch_size * (float(xp.abs(p).sum()) if reg == "L1"
                                                else 0.5 * float((p * p).sum()))
        self.loss = loss
        if not self.dense_frozen:
            for i, ps in enumerate(self.params):
                for j, p in enumerate(ps):
                    g = param_grads[i][j]
                    if g is None and not regs:
                        continue
                    g = xp.zeros_like(p) if g is None else g.astype(np.float32, copy=False)
                    if self.mixed:
                        g = g * inv
                    for reg, lam in regs:
                        g = g + (lam / batch_size) * (xp.sign(p) if reg == "L1" else p)
                    self.optimizer.update_dense(p, g, self.opt_states[i][j], lr, step)
        for spec, table in zip(self.embedding_specs, self.tables):
            g = input_grads.get(spec.name)
            if g is None:
                continue
            g = g.astype(np.float32, copy=False)
            if self.mixed:
                g = g * inv
            table.backward(g, lr, step)

    # -- inference -----------------------------------------------------------------------------

    def _predict_tensors(self, tensors) -> list[Any]:
        outs = []
        for layer, logits in self.network.prediction_inputs():
            p = layer.predict(self.xp, tensors[logits].astype(np.float32, copy=False))
            outs.append(p.reshape(p.shape[0], -1))
        return outs

    def predict_batch(self, batch) -> np.ndarray:
        """Inference-mode probabilities ``[B, label_dim]`` for one batch (host numpy)."""
        tensors = self._tensors(batch)
        self._lookup(batch, tensors)
        self.network.forward(self.xp, tensors, self._params_for_compute(), self.states, False,
                             with_loss=False)
        outs = self._predict_tensors(tensors)
        return to_numpy(outs[0] if len(outs) == 1 else self.xp.concatenate(outs, axis=1))

    def evaluate_batch(self, batch) -> tuple[np.ndarray, np.ndarray, float]:
        """``(predictions, labels, loss)`` of one batch in inference mode (host numpy,
        ``[B, label_dim]`` each); its tensors become ``last_tensors["Evaluate"]``."""
        xp = self.xp
        tensors = self._tensors(batch)
        self._lookup(batch, tensors)
        self.network.forward(xp, tensors, self._params_for_compute(), self.states, False,
                             loss_dtype=np.float32 if self.mixed else None)
        self.last_tensors["Evaluate"] = tensors
        preds = [to_numpy(p) for p in self._predict_tensors(tensors)]
        pred = preds[0] if len(preds) == 1 else np.concatenate(preds, axis=1)
        label = to_numpy(batch.label).reshape(len(pred), -1)
        return pred, label, self._loss_value(tensors)

    def dense_parameters(self) -> list[np.ndarray]:
        """The dense weights in dense-file order (host copies)."""
        return [to_numpy(p).copy() for ps in self.params for p in ps]


__all__ = ["TrainingEngine"]
