"""Training past one process: ``mpiexec -n N python train.py`` runs a HugeCTR-style script
on N ranks.

* Dense layers are data-parallel: every rank holds the whole dense model, trains on its share
  of each global batch (:mod:`.reader`) and the gradients are averaged by one fused allreduce
  per step (:mod:`.allreduce`), so every rank applies the same update.
* Embedding tables are model-parallel (:mod:`.sharded_table`): each rank holds the rows it
  owns; lookups and gradients move by all-to-all exchanges of unique keys and vectors.
* Evaluation metrics are computed over every rank's predictions (:mod:`.metrics`).
* ``save_params_to_files`` writes one model, the files a one-process run writes (rank 0
  writes; rows in rank order), and any number of ranks loads it back.
* Online learning (``fit(update_source=..., repository=...)``): every rank publishes the
  rows it owns (``get_incremental_model`` gives a rank its own changed rows); rank 0 alone
  writes each exported version.
* The Estimator API trains on the ranks too (:mod:`.estimator`).
* ``vvgpu`` lists one device per rank (:mod:`.devices`).
* No collective hangs on a lost rank (:mod:`.comm`).

A process not started by an MPI launcher (or started with one rank) never imports mpi4py and
trains exactly as before.
"""

from __future__ import annotations

from typing import Any

from .comm import LocalComm, MpiComm, RankLostError, launched_size, world
from .devices import device_list, rank_device


class Distributed:
    """The hooks a :class:`~tierserve.trainer.hugectr.model.Model` calls when it runs on several
    ranks: built by :func:`for_solver` before compiling, :meth:`attach` after."""

    def __init__(self, comm: Any, solver: Any) -> None:
        self.comm = comm
        self.rank = comm.rank
        self.size = comm.size
        self.node, self.device = rank_device(solver.vvgpu, self.rank, self.size)
        self.devices = [self.device]

    def attach(self, model: Any) -> None:
        """Shard the model's tables, readers and metrics across the ranks."""
        from .metrics import GatheredMetrics
        from .reader import ShardedReader
        from .sharded_table import ShardedTable

        if model.xp is not __import__("numpy"):
            from tierserve.core.errors import ConfigError

            raise ConfigError("multi-rank training runs on the CPU (numpy) only; set "
                              "TIERSERVE_FORCE_CPU=1")
        model.tables = [ShardedTable(t, self.comm) for t in model.tables]
        model._train_reader = ShardedReader(model._train_reader, self.rank, self.size)
        if model._eval_reader is not None:
            model._eval_reader = ShardedReader(model._eval_reader, self.rank, self.size)
        eval_reader = model._eval_reader
        model._metrics = GatheredMetrics(
            model.solver.metrics_spec, self.comm,
            skip=None if eval_reader is None else (lambda: eval_reader.placeholder))

    def reopen_readers(self, model: Any) -> None:
        """Wrap readers a model opened again."""
        from .reader import ShardedReader

        if not isinstance(model._train_reader, ShardedReader):
            model._train_reader = ShardedReader(model._train_reader, self.rank, self.size)
        if model._eval_reader is not None and not isinstance(model._eval_reader, ShardedReader):
            model._eval_reader = ShardedReader(model._eval_reader, self.rank, self.size)

    def reduce_step(self, loss: float, param_grads: list, input_grads: dict,
                    n_local: int) -> tuple[float, int]:
        """Average the dense gradients over the global batch (in place), scale this rank's
        embedding-output gradients to the global batch's mean loss; returns the global loss
        and batch size."""
        from .allreduce import allreduce_gradients

        loss, total = allreduce_gradients(self.comm, param_grads, loss, n_local)
        scale = n_local / max(total, 1)
        for name, g in input_grads.items():
            if g is not None:
                input_grads[name] = g * scale
        return loss, total

    @property
    def writes_files(self) -> bool:
        """Whether this rank writes the dense and graph files (rank 0)."""
        return self.rank == 0

    def barrier(self, what: str) -> None:
        self.comm.barrier(what)

    def version_number(self, home: Any) -> int:
        """The number of the version rank 0 writes next into the model folder ``home``, on
        every rank (collective)."""
        import numpy as np

        from tierserve.model.version_folder import next_version

        mine = next_version(home) if self.rank == 0 else 0
        buf = np.asarray([mine], dtype=np.float64)
        return int(self.comm.allreduce_sum(buf, "export: version number")[0])

    def join_export(self, model: Any, home: Any, name: str, iteration: int) -> Any:
        """A rank's part (other than rank 0's) in exporting a version of ``model``: the
        collective save that hands its rows to rank 0, which writes the version's files;
        returns the version's folder."""
        import tempfile
        from pathlib import Path

        version = self.version_number(home)
        with tempfile.TemporaryDirectory(prefix="tierserve-export-") as scratch:
            model.save_params_to_files(str(Path(scratch) / name), iteration)  # writes nothing
        return Path(home) / str(version)


def for_solver(solver: Any) -> Distributed | None:
    """The distributed context for a model under an MPI launcher with several ranks, else
    None (``vvgpu`` checked against the rank count)."""
    if launched_size() <= 1:
        return None
    return Distributed(world(), solver)


def resume(model: Any, prefix: str, iteration: int) -> None:
    """Load the snapshot ``save_params_to_files(prefix, iteration)`` wrote (dense weights and
    state, tables and optimizer states) into a compiled ``model`` and continue its update
    count from ``iteration``, on any number of ranks."""
    from tierserve.model.dense_file import dense_model_name, dense_optimizer_name
    from tierserve.ps.sparse_file import sparse_model_name, sparse_optimizer_name

    n = len(model.tables)
    model.load_dense_weights(dense_model_name(prefix, iteration))
    model.load_dense_optimizer_states(dense_optimizer_name(prefix, iteration))
    model.load_sparse_weights([sparse_model_name(prefix, i, iteration) for i in range(n)])
    model.load_sparse_optimizer_states([sparse_optimizer_name(prefix, i, iteration)
                                        for i in range(n)])
    model.engine.step = int(iteration)


__all__ = [
    "Distributed",
    "LocalComm",
    "MpiComm",
    "RankLostError",
    "device_list",
    "for_solver",
    "launched_size",
    "rank_device",
    "resume",
    "world",
]
