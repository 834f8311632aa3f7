"""The model's seams to the data readers, embedding tables, learning-rate scheduler and
metrics: small functions so :mod:`.model` does not depend on their constructors' details."""

from __future__ import annotations

from typing import Any

from tierserve.core.errors import ConfigError
from tierserve.trainer.data.params import DataReaderSparseParam
from tierserve.trainer.data.reader import create_data_reader
from tierserve.trainer.hugectr.layer_specs import Input


class ReaderHandle:
    """HugeCTR's ``DataReader`` surface over a data reader: ``read_a_batch`` (the model's),
    ``set_source`` and ``is_eof``."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def next_batch(self):
        return self.reader.read_a_batch()

    def set_source(self, file_name: Any = "") -> None:
        self.reader.set_source(file_name)

    def is_eof(self) -> bool:
        return self.reader.is_eof()

    def close(self) -> None:
        self.reader.close()


def make_reader(params, source, batch_size, model_input: Input, sparse_params, solver,
                repeat: bool, eval_mode: bool = False) -> ReaderHandle:
    reader = create_data_reader(
        params, batch_size, model_input.label_dims, model_input.dense_dim, sparse_params,
        i64_input_key=solver.i64_input_key, repeat_dataset=repeat, eval=eval_mode,
    )
    return ReaderHandle(reader)


def input_from_data_layer(data: dict[str, Any]) -> Input:
    """The ``Input`` a graph JSON's Data layer describes."""
    label = data.get("label") or {}
    dense = data.get("dense") or {}
    sparse = [DataReaderSparseParam.from_graph(s) for s in data.get("sparse", []) or []]
    if "top" not in dense:
        raise ConfigError("the graph's Data layer has no dense input")
    return Input(label_dim=label.get("label_dim", 1), label_name=label.get("top", "label"),
                 dense_dim=int(dense.get("dense_dim", 0)), dense_name=dense["top"],
                 data_reader_sparse_param_array=sparse)


# -- embedding tables ----------------------------------------------------------------------------

def make_table(spec, opt_params, solver, xp):
    """The trainable table of one embedding layer of the graph."""
    from tierserve.trainer.embedding.table import EmbeddingTable

    slot_sizes = spec.hparam.get("slot_size_array") or None
    workspace = spec.hparam.get("workspace_size_per_gpu_in_mb")
    if workspace is None and "max_vocabulary_size_per_gpu" in spec.hparam:
        # older HugeCTR graphs give rows; turn them into the workspace that holds them
        from tierserve.trainer.optimizers import make_optimizer

        copies = make_optimizer(opt_params).num_state_copies
        rows = int(spec.hparam["max_vocabulary_size_per_gpu"])
        workspace = rows * (1 + copies) * 4 * spec.embedding_vec_size / float(1 << 20)
    if workspace is None:
        raise ConfigError(f"embedding {spec.name!r}: sparse_embedding_hparam has no "
                          "workspace_size_per_gpu_in_mb")
    return EmbeddingTable(
        spec.type, spec.embedding_vec_size, workspace,
        opt_params, combiner=spec.combiner, slot_size_array=slot_sizes, name=spec.name,
        seed=solver.seed, xp=xp,
    )


def save_table(table, model_path: str, optimizer_path: str) -> None:
    table.save(model_path)
    table.save_optimizer_state(optimizer_path)


def load_table(table, path: str) -> None:
    from tierserve.ps.sparse_file import read_sparse_model

    table.load(read_sparse_model(path, table.dim))


def load_table_optimizer(table, path: str) -> None:
    table.load_optimizer_state_file(path)


def incremental(table):
    return table.incremental()


# -- learning rate and metrics ------------------------------------------------------------------

def make_scheduler(solver):
    from tierserve.trainer.lr_scheduler import LearningRateScheduler

    return LearningRateScheduler(solver.lr, solver.warmup_steps, solver.decay_start,
                                 solver.decay_steps, solver.decay_power, solver.end_lr)


def auc_threshold(metrics_spec) -> float | None:
    """The AUC that stops ``fit`` (None when AUC is not in the spec or its value is 1)."""
    for k, v in metrics_spec.items():
        if getattr(k, "name", str(k)) == "AUC" and float(v) < 1.0:
            return float(v)
    return None
