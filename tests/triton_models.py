"""Small models and repositories for the Triton tests: a one-hot DLRM with 64-bit keys (the
demo), a multi-hot model trained with 32-bit keys, and an embedding-store model."""

from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MH_SLOTS = 3
MH_DENSE = 4
MH_DIM = 8
MH_NNZ = 3
MH_ITERS = 8


@dataclass
class Trained:
    """A trained model's files and the trainer's Model (for reference predictions)."""

    name: str
    graph: Path
    dense: Path
    sparse: list[Path]
    model: object
    data_source: str
    i64_keys: bool
    table: str  # the embedding table's name in the graph


def train_multi_hot32(workdir: Path, name: str = "mh32") -> Trained:
    """A multi-hot model (1 to 3 keys per slot) trained the HugeCTR default way, 32-bit keys."""
    import tierserve.trainer as hugectr

    workdir.mkdir(parents=True, exist_ok=True)
    data = hugectr.DataGenerator(
        hugectr.DataGeneratorParams(
            format=hugectr.DataReaderType_t.Norm, label_dim=1, dense_dim=MH_DENSE,
            num_slot=MH_SLOTS, i64_input_key=False,
            source=str(workdir / "data" / "train" / "_file_list.txt"),
            eval_source=str(workdir / "data" / "eval" / "_file_list.txt"),
            slot_size_array=[300, 200, 100], nnz_array=[MH_NNZ] * MH_SLOTS, variable_nnz=True,
            check_type=hugectr.Check_t.Sum, num_files=1, eval_num_files=1,
            num_samples_per_file=2048, num_samples=2048, eval_num_samples=512, seed=3,
        )
    ).generate()  # fmt: skip
    solver = hugectr.CreateSolver(model_name=name, batchsize=256, batchsize_eval=256,
                                  max_eval_batches=1, lr=0.01, i64_input_key=False,
                                  repeat_dataset=True)  # fmt: skip
    reader = hugectr.DataReaderParams(
        data_reader_type=hugectr.DataReaderType_t.Norm, source=[data.train.source],
        eval_source=data.eval.source, check_type=hugectr.Check_t.Sum,
    )  # fmt: skip
    optimizer = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.Adam)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        model = hugectr.Model(solver, reader, optimizer)
        model.add(
            hugectr.Input(
                label_dim=1,
                label_name="label",
                dense_dim=MH_DENSE,
                dense_name="dense",
                data_reader_sparse_param_array=[
                    hugectr.DataReaderSparseParam("data1", MH_NNZ, False, MH_SLOTS)
                ],
            )
        )
        model.add(
            hugectr.SparseEmbedding(
                embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
                workspace_size_per_gpu_in_mb=1,
                embedding_vec_size=MH_DIM,
                combiner="sum",
                sparse_embedding_name="emb",
                bottom_name="data1",
                optimizer=optimizer,
            )
        )
        model.add(
            hugectr.DenseLayer(
                layer_type=hugectr.Layer_t.Reshape,
                bottom_names=["emb"],
                top_names=["flat"],
                leading_dim=MH_SLOTS * MH_DIM,
            )
        )
        model.add(
            hugectr.DenseLayer(
                layer_type=hugectr.Layer_t.Concat,
                bottom_names=["flat", "dense"],
                top_names=["both"],
            )
        )
        model.add(
            hugectr.DenseLayer(
                layer_type=hugectr.Layer_t.InnerProduct,
                bottom_names=["both"],
                top_names=["fc"],
                num_output=1,
            )
        )
        model.add(
            hugectr.DenseLayer(
                layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                bottom_names=["fc", "label"],
                top_names=["loss"],
            )
        )
        model.compile()
        model.fit(max_iter=MH_ITERS, display=1000, eval_interval=1000)
    out = workdir / "model"
    out.mkdir(exist_ok=True)
    model.graph_to_json(str(out / f"{name}.json"))
    model.save_params_to_files(str(out / name), MH_ITERS)
    return Trained(name, out / f"{name}.json", out / f"{name}_dense_{MH_ITERS}.model",
                   [out / f"{name}0_sparse_{MH_ITERS}.model"], model, data.train.source,
                   False, "emb")  # fmt: skip


def from_demo(demo) -> Trained:
    """The demo DLRM (``clients.demo_model.train_demo_model``) as a :class:`Trained`."""
    return Trained("dlrm", demo.graph, demo.dense_file, list(demo.sparse_files), demo.model,
                   demo.data_source, True, "sparse_embedding1")  # fmt: skip


def copy_version(trained: Trained, folder: Path, *, graph: bool = True) -> Path:
    """Copy a trained model's files (and, with its graph, its checksum manifest) into version
    ``folder``; an embedding store's folder holds the sparse folders alone."""
    from tierserve.model import manifest

    folder.mkdir(parents=True)
    files = [*trained.sparse]
    if graph:
        files += [trained.graph, trained.dense,
                  *trained.dense.parent.glob(trained.dense.name + ".*")]  # fmt: skip
    for f in files:
        (shutil.copytree if f.is_dir() else shutil.copy2)(f, folder / f.name)
    if graph:
        manifest.copy_entries(files, folder)
    return folder


def model_entry(name: str, trained: Trained, slots: int, dim: int, hotness: int,
                max_batch_size: int = 256) -> dict:  # fmt: skip
    """The ps.json entry of ``name`` serving ``trained``'s files."""
    return {
        "model": name,
        "sparse_files": [f"{name}/1/{p.name}" for p in trained.sparse],
        "dense_file": f"{name}/1/{trained.dense.name}",
        "network_file": f"{name}/1/{trained.graph.name}",
        "max_batch_size": max_batch_size,
        "default_value_for_each_table": [0.0],
        "maxnum_catfeature_query_per_table_per_sample": [hotness],
        "embedding_vecsize_per_table": [dim],
        "embedding_table_names": [trained.table],
        "label_dim": 1,
        "slot_num": slots,
    }


def write_ps_json(root: Path, entries: list[dict], *, supportlonglong: bool,
                  update_source: dict | None = None) -> Path:  # fmt: skip
    """``root/ps.json``: one in-process hash map per process (no persistent tier)."""
    data = {
        "supportlonglong": supportlonglong,
        "volatile_db": {"type": "hash_map", "initial_cache_rate": 1.0},
        "models": entries,
    }
    if update_source:
        data["update_source"] = update_source
    root.mkdir(parents=True, exist_ok=True)
    (root / "ps.json").write_text(json.dumps(data, indent=2))
    return root / "ps.json"


def store_lookup(sparse: Path, dim: int, keys: np.ndarray, default: float = 0.0) -> np.ndarray:
    """Embeddings of ``keys`` read straight from a sparse model folder (unknown: default)."""
    from tierserve.ps.sparse_file import read_sparse_model

    table = read_sparse_model(sparse, dim)
    known = np.asarray(table.keys, dtype=np.int64)
    order = np.argsort(known)
    at = np.clip(np.searchsorted(known[order], keys), 0, len(known) - 1)
    found = known[order][at] == keys
    out = np.full((len(keys), dim), default, dtype=np.float32)
    out[found] = np.asarray(table.embeddings)[order][at[found]]
    return out
