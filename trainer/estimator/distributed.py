"""The Estimator under ``mpiexec -n N``: ``train``, ``evaluate`` and ``train_and_evaluate``
on N ranks, with the Model API's distributed pieces.

* **Tables model-parallel.**  Each feature-column table is a :class:`ShardedColumnTable`
  (the Model API's :class:`~.sharded_table.ShardedTable` over the Estimator's
  ``ColumnTable``): a rank holds the ids it owns (``mix64(key) % N``), lookups and gradients
  move by all-to-all exchanges, so the optimizer (FTRL, Adagrad, Adam, ...) updates each row
  where it lives, exactly as one process would.
* **Dense layers data-parallel.**  Every rank holds the whole dense model; gradients are
  averaged over the global batch by the fused allreduce (:mod:`.allreduce`), each rank
  weighted by its samples, so all ranks apply the same update.
* **Input.**  By default each batch the ``input_fn`` gives is a *global* batch and rank ``r``
  trains on its share (``numpy.array_split`` by sample, as the Model API's reader), so N ranks
  with batch B train as one process with batch B.  An ``input_fn`` with an ``input_context``
  parameter (TensorFlow's ``tf.distribute.InputContext``: ``num_input_pipelines``,
  ``input_pipeline_id``, ``get_per_replica_batch_size``) reads its own share instead and its
  batches are used whole; training stops for all ranks when one rank's input ends.
  ``RunConfig`` reports the rank as TensorFlow's cluster properties (``is_chief``,
  ``global_id_in_cluster``, ``num_worker_replicas``).
* **Checkpoints** hold the whole model (every rank's rows), written by the chief (rank 0)
  into ``model_dir``, which every rank must see (one host, or a shared file system); a
  checkpoint restores into any number of ranks.
* **Evaluation, prediction, export** read the newest checkpoint into a one-process copy of
  the Estimator (TensorFlow's separate evaluator): ``evaluate`` on every rank evaluates each
  rank's share of the input and merges the metrics over all ranks' predictions;
  ``train_and_evaluate`` evaluates and exports on the chief alone, the other ranks train;
  ``export_saved_model`` runs on the chief.

A checkpoint is gathered on every rank before the chief writes it, and the one-process copy
holds whole tables: tables must fit one process's memory at those moments.  Batch
normalisation uses each rank's share's statistics (no synchronised batch norm).
"""

from __future__ import annotations

import copy
import inspect
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.trainer.distributed.allreduce import allreduce_gradients
from tierserve.trainer.distributed.metrics import _average_loss
from tierserve.trainer.distributed.reader import share
from tierserve.trainer.distributed.sharded_table import ShardedTable

log = logging.getLogger("tierserve.trainer.estimator")


@dataclass(frozen=True)
class InputContext:
    """What an ``input_fn(input_context)`` reads to take its share (TensorFlow's
    ``tf.distribute.InputContext``)."""

    num_input_pipelines: int = 1
    input_pipeline_id: int = 0
    num_replicas_in_sync: int = 1

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """The batch each rank reads for a global batch of ``global_batch_size``."""
        if global_batch_size % self.num_replicas_in_sync:
            raise ConfigError(f"global batch size {global_batch_size} is not divisible by "
                              f"the {self.num_replicas_in_sync} ranks")
        return global_batch_size // self.num_replicas_in_sync


def takes_input_context(input_fn: Any) -> bool:
    """Whether ``input_fn`` names an ``input_context`` parameter (it reads its own share)."""
    if not callable(input_fn):
        return False
    try:
        return "input_context" in inspect.signature(input_fn).parameters
    except (TypeError, ValueError):
        return False


class ShardedColumnTable(ShardedTable):
    """An Estimator table split over the ranks: the :class:`ShardedTable` exchanges, plus the
    checkpoint interface the Estimator's variable store uses (collective where it gathers)."""

    collective = True  # every rank must call forward/backward, even with no ids

    def export_optimizer_state(self) -> dict[str, np.ndarray]:
        """Every rank's optimizer state in :meth:`export`'s row order (collective)."""
        owned = self._owned()
        out = {}
        for name, a in self.local.export_optimizer_state().items():
            out[name], _ = self.comm.allgatherv(np.ascontiguousarray(a[owned]),
                                                f"checkpoint: optimizer state {name}")
        return out

    def load_optimizer_state(self, keys: Any, states: dict[str, Any]) -> None:
        """Keep the optimizer state of the keys this rank owns."""
        keys = np.asarray(keys, dtype=np.int64)
        mine = self._mine(keys, None)
        self.local.load_optimizer_state(keys[mine], {k: np.asarray(v)[mine]
                                                     for k, v in states.items()})

    def lookup(self, sparse: Any, combiner: str | None = None) -> Any:
        raise ConfigError("a sharded Estimator table is read for evaluation from the "
                          "checkpoint, not looked up in place")


class EstimatorRun:
    """One Estimator's place in the MPI job (see the module docstring); the Estimator calls
    it where a multi-rank run differs from one process."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.rank = comm.rank
        self.size = comm.size
        self.is_chief = self.rank == 0
        #: whether the batch being trained is a stand-in for an empty share (weighs nothing)
        self.placeholder = False
        self._twin: Any = None
        self._ended_logged = False

    # -- variables -------------------------------------------------------------------------

    def store(self, seed: int) -> Any:
        """The Estimator's variable store, tables sharded over the ranks."""
        from ..estimator.variables import VariableStore

        run = self

        class ShardedVariableStore(VariableStore):
            reduce_step = staticmethod(run.reduce_step)

            def _new_table(self, *args: Any, **kwargs: Any) -> Any:
                table = super()._new_table(*args, **kwargs)
                if table.xp is not np:
                    raise ConfigError(f"embedding table {table.name!r} is placed on a GPU; "
                                      "under mpiexec the Estimator's tables live in host "
                                      "memory (drop the column's GPU device)")
                return ShardedColumnTable(table, run.comm)

        return ShardedVariableStore(seed)

    def reduce_step(self, loss: float | None, param_grads: list, input_grads: dict,
                    n: int) -> float | None:
        """Average the dense gradients over the global batch (in place), scale this rank's
        table-output gradients to the global batch's mean loss; returns the global loss."""
        n_local = 0 if self.placeholder else int(n)
        total_loss, total = allreduce_gradients(
            self.comm, param_grads, float(loss) if (loss is not None and n_local) else 0.0,
            n_local)
        scale = np.float32(n_local / max(total, 1))
        for name, g in input_grads.items():
            if g is not None:
                input_grads[name] = g * scale
        return total_loss

    def save(self, estimator: Any, directory: str | None, basename: str) -> Path:
        """Gather the whole model (collective); the chief writes the checkpoint."""
        from ..estimator import checkpoint as ckpt

        store = estimator._store
        arrays = store.arrays()
        directory = directory or estimator.model_dir
        path = Path(directory) / f"{basename}-{int(store.global_step)}.npz"
        if self.is_chief:
            path = ckpt.save(directory, arrays, store.global_step,
                             estimator.config.keep_checkpoint_max, basename)
        self.comm.barrier("checkpoint written")  # no rank reads it before it is whole
        return path

    # -- agreement -------------------------------------------------------------------------

    def any(self, flag: bool, what: str) -> bool:
        """Whether ``flag`` holds on any rank (collective)."""
        buf = np.asarray([1.0 if flag else 0.0], dtype=np.float64)
        return bool(self.comm.allreduce_sum(buf, what)[0] > 0)

    def chief_says(self, flag: bool, what: str) -> bool:
        """The chief's ``flag``, on every rank (collective)."""
        return self.any(flag and self.is_chief, what)

    def saver_hook(self, hook: Any) -> Any:
        """``hook`` (a CheckpointSaverHook) with its timer read on the chief, so every rank
        saves at the same step."""
        from ..estimator.hooks import CheckpointSaverHook

        run = self

        class AgreedCheckpointSaverHook(CheckpointSaverHook):
            def after_run(self, run_context: Any, run_values: Any) -> None:
                if self.save_steps is not None:  # the same on every rank
                    super().after_run(run_context, run_values)
                    return
                due = time.monotonic() - self._last_time >= float(self.save_secs)
                if run.chief_says(due, "checkpoint timer"):
                    self._save(run_context.session)

        agreed = AgreedCheckpointSaverHook(hook.checkpoint_dir, save_secs=hook.save_secs,
                                           save_steps=hook.save_steps,
                                           checkpoint_basename=hook.basename,
                                           listeners=hook.listeners)
        return agreed

    # -- input -----------------------------------------------------------------------------

    def batches(self, estimator: Any, input_fn: Any, mode: str, repeat_single: bool,
                steps: int | None = None, record: list | None = None
                ) -> Iterator[tuple[dict, Any]]:
        """This rank's batches of ``input_fn``: its share of each global batch, or (an
        ``input_fn`` taking ``input_context``) what the input_fn reads for this rank.
        Training: a stand-in sample for an empty share (:attr:`placeholder`), and every
        rank stops when one rank's input ends.  Otherwise an empty share is skipped and,
        with ``record``, noted there (``False``; ``True`` for a batch given);
        ``steps`` bounds the global batches read."""
        from ..estimator.program import batch_size_of
        from ..estimator.spec import ModeKeys

        training = mode == ModeKeys.TRAIN
        own = takes_input_context(input_fn)
        context = InputContext(self.size, self.rank, self.size) if own else None
        result = estimator._call_input_fn(input_fn, mode, input_context=context)
        stream = estimator._input_batches(result, repeat_single)
        if own:
            yield from (self._agreed(stream) if training else stream)
            return
        self.placeholder = False
        for i, (features, labels) in enumerate(stream):
            if steps is not None and i >= steps:
                return
            lo, hi = share(batch_size_of(features, labels), self.rank, self.size)
            if hi == lo:
                if not training:
                    if record is not None:
                        record.append(False)
                    continue
                self.placeholder, lo, hi = True, 0, 1
            else:
                self.placeholder = False
            if record is not None:
                record.append(True)
            yield _cut(features, lo, hi), None if labels is None else _cut(labels, lo, hi)
        self.placeholder = False

    def _agreed(self, stream: Iterator) -> Iterator:
        """``stream`` while every rank still has a batch (collective per batch)."""
        it = iter(stream)
        while True:
            item = next(it, None)
            if self.any(item is None, "end of the training input"):
                if item is not None and not self._ended_logged:
                    self._ended_logged = True
                    log.warning("rank %d: another rank's training input ended; every rank "
                                "stops training", self.rank)
                return
            yield item

    # -- evaluation, prediction, export ----------------------------------------------------

    def twin(self, estimator: Any) -> Any:
        """A one-process copy of ``estimator`` (same model_fn, model_dir and settings) that
        reads the newest checkpoint whole; writes summaries on the chief only."""
        if self._twin is None:
            from ..estimator.variables import VariableStore

            twin = copy.copy(estimator)
            twin.__dict__.update(_dist=None, _store=VariableStore(estimator._store.seed),
                                 _programs={}, _loaded=None, _loaded_signature={},
                                 _summary={}, _last_saved_step=None, _gather_eval=None)
            if not self.is_chief:
                twin._config = estimator.config.replace(save_summary_steps=0)
                for k in ("is_chief", "num_worker_replicas", "task_type", "task_id",
                          "global_id_in_cluster", "cluster_spec"):
                    setattr(twin._config, k, getattr(estimator.config, k))
            self._twin = twin
        return self._twin

    def evaluate(self, estimator: Any, input_fn: Any, steps: int | None, hooks: Any,
                 checkpoint_path: Any, name: str | None) -> dict[str, Any]:
        """Every rank evaluates its share of ``input_fn`` on the newest checkpoint; the
        metrics are computed over all ranks' predictions (collective)."""
        from ..estimator.spec import ModeKeys

        twin = self.twin(estimator)
        record: list[bool] = []
        stream = self.batches(estimator, input_fn, ModeKeys.EVAL, False,
                              None if steps is None else int(steps), record)
        twin._gather_eval = lambda ops, values, losses: self.merge_metrics(
            ops, values, losses, record if not takes_input_context(input_fn) else None)
        try:
            return twin.evaluate(lambda: stream, hooks=hooks, checkpoint_path=checkpoint_path,
                                 name=name)
        finally:
            twin._gather_eval = None

    def merge_metrics(self, ops: dict, values: dict[str, list], losses: list[tuple],
                      record: list[bool] | None) -> dict[str, Any]:
        """``eval_metric_ops`` recomputed over every rank's values, ``loss`` (the mean of the
        global batches' losses) and ``average_loss`` (per example), on every rank
        (collective).  ``values[k]``: per batch, op ``k``'s input arrays; ``losses``: per
        batch ``(loss, examples)``; ``record``: which global batches this rank had a share of
        (None: the ranks' batches are their own, not shares of global ones)."""
        comm = self.comm
        counts, _ = comm.allgatherv(np.asarray([len(losses)], dtype=np.int64),
                                    "evaluate: batches")
        if (counts == 0).any():
            empty = [r for r, c in enumerate(counts.tolist()) if c == 0]
            raise InvalidInputError(
                f"evaluate under mpiexec: rank(s) {empty} of {self.size} got no evaluation "
                "batch (every rank needs at least one: give more evaluation data, or let the "
                "input_fn's input_context share it)")
        rows = iter(losses)
        local = []
        for had in (record if record is not None else [True] * len(losses)):
            if had:
                loss, n = next(rows)
                local.append((float(loss) * n, float(n)))
            else:
                local.append((0.0, 0.0))
        pairs, per_rank = comm.allgatherv(np.asarray(local, dtype=np.float64).reshape(-1, 2),
                                          "evaluate: losses")
        metrics: dict[str, Any] = {}
        for key in sorted(ops):
            op = ops[key]
            columns = list(zip(*values[key]))
            gathered = []
            for i, arrays in enumerate(columns):
                mine = np.concatenate([_rows(a) for a in arrays])
                everyone, _ = comm.allgatherv(np.ascontiguousarray(mine),
                                              f"evaluate: metric {key} input {i}")
                gathered.append(everyone)
            op.reset()
            op.update(gathered)
            metrics[key] = op.result()
        metrics["loss"] = _average_loss(pairs, per_rank)
        metrics["average_loss"] = float(pairs[:, 0].sum() / max(pairs[:, 1].sum(), 1.0))
        return metrics

    def export(self, estimator: Any, *args: Any, **kwargs: Any) -> bytes:
        """``export_saved_model`` on the chief, from the newest checkpoint."""
        if not self.is_chief:
            raise ConfigError(
                f"export_saved_model under mpiexec runs on the chief (rank 0), not rank "
                f"{self.rank}: call it when estimator.config.is_chief (train_and_evaluate's "
                "exporters do)")
        return self.twin(estimator).export_saved_model(*args, **kwargs)


def _rows(value: Any) -> np.ndarray:
    """A metric input as float64 rows ``[n, width]``."""
    a = np.asarray(value, dtype=np.float64)
    return a.reshape(1, -1) if a.ndim == 0 else a.reshape(a.shape[0], -1)


def _cut(value: Any, lo: int, hi: int) -> Any:
    """Examples ``[lo, hi)`` of a batch's features or labels."""
    if isinstance(value, dict):
        return {k: _cut(v, lo, hi) for k, v in value.items()}
    if isinstance(value, (np.ndarray, list, tuple)):
        return value[lo:hi]
    if hasattr(value, "iloc"):  # a pandas Series or DataFrame
        return value.iloc[lo:hi]
    raise InvalidInputError(
        f"a batch value of type {type(value).__name__} cannot be split between the ranks; "
        "give the input_fn an input_context parameter and read each rank's share there")


def for_estimator() -> EstimatorRun | None:
    """The Estimator's distributed context under an MPI launcher with several ranks, else
    None."""
    from tierserve.trainer.distributed.comm import launched_size, world

    if launched_size() <= 1:
        return None
    return EstimatorRun(world())
