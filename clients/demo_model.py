"""The demo DLRM: generated data, a small model trained with the embedded trainer, and a
model repository to serve it from.

Shared by ``tierserve demo``, the server tests and ``bench/server``.  The script is the
HugeCTR DLRM sample with ``import tierserve.trainer as hugectr`` and small sizes.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MODEL_NAME = "dlrm"
DENSE_DIM = 13
SLOT_SIZES = [1000, 500, 2000, 300, 50, 800, 100, 1200]
EMBEDDING_DIM = 16


@dataclass
class DemoModel:
    """Where the demo's pieces are."""

    workdir: Path
    data_source: str  # Norm file list of the training split
    eval_source: str  # Norm file list of the evaluation split
    graph: Path
    dense_file: Path
    sparse_files: list[Path]
    model: object  # the trained tierserve.trainer.Model
    eval_auc: float = float("nan")  # AUC on the first eval_batches batches of the eval split
    eval_batches: int = 0


def generate_data(workdir: Path, num_samples: int = 65536, seed: int = 7):
    """A Norm dataset from the trainer's planted-model generator."""
    import tierserve.trainer as hugectr

    params = hugectr.DataGeneratorParams(
        format=hugectr.DataReaderType_t.Norm,
        label_dim=1,
        dense_dim=DENSE_DIM,
        num_slot=len(SLOT_SIZES),
        i64_input_key=True,
        source=str(workdir / "data" / "train" / "_file_list.txt"),
        eval_source=str(workdir / "data" / "eval" / "_file_list.txt"),
        slot_size_array=SLOT_SIZES,
        nnz_array=[1] * len(SLOT_SIZES),
        check_type=hugectr.Check_t.Sum,
        num_files=2,
        eval_num_files=1,
        num_samples_per_file=num_samples // 2,
        num_samples=num_samples,
        eval_num_samples=num_samples // 4,
        seed=seed,
    )
    return hugectr.DataGenerator(params).generate()


def train_demo_model(
    workdir: str | Path,
    iterations: int = 120,
    batch_size: int = 512,
    seed: int = 7,
    num_samples: int = 65536,
    say: Callable[[str], None] | None = None,
) -> DemoModel:
    """Generate data, train the demo DLRM for ``iterations`` steps and save its files;
    ``say`` is told of each step as it starts.

    The defaults (about one epoch over 65,536 generated rows) reach an eval AUC near 0.86;
    many more passes over so few rows overfit the per-key embeddings.
    """
    from tierserve.trainer.progress import heartbeat

    beat = heartbeat("[demo] generating data") if say else contextlib.nullcontext()
    say = say or (lambda text: None)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    say(f"generating {num_samples:,} click-log rows with a planted model in {workdir / 'data'}")
    with beat:
        dataset = generate_data(workdir, num_samples=num_samples, seed=seed)
    model = build_demo_model(dataset.train.source, dataset.eval.source, batch_size, seed)
    say(f"training a small DLRM for {iterations} iterations of {batch_size} rows")
    model.fit(max_iter=iterations, display=max(iterations, 1), eval_interval=iterations + 1)
    eval_batches = 8
    for _ in range(eval_batches):
        model.eval()
    auc = dict(model.get_eval_metrics()).get("AUC", float("nan"))
    graph, dense, sparse = _save(model, workdir / "model", iterations)
    return DemoModel(
        workdir=workdir,
        data_source=dataset.train.source,
        eval_source=dataset.eval.source,
        graph=graph,
        dense_file=dense,
        sparse_files=sparse,
        model=model,
        eval_auc=auc,
        eval_batches=eval_batches,
    )


#: The demo DLRM's dense layers: (Layer_t name, bottoms, tops, num_output).
DENSE_LAYERS = [
    ("InnerProduct", ["dense"], ["fc1"], 64),
    ("ReLU", ["fc1"], ["relu1"], None),
    ("InnerProduct", ["relu1"], ["fc2"], EMBEDDING_DIM),
    ("ReLU", ["fc2"], ["relu2"], None),
    ("Interaction", ["relu2", "sparse_embedding1"], ["interaction1"], None),
    ("InnerProduct", ["interaction1"], ["fc3"], 64),
    ("ReLU", ["fc3"], ["relu3"], None),
    ("InnerProduct", ["relu3"], ["fc4"], 1),
    ("BinaryCrossEntropyLoss", ["fc4", "label"], ["loss"], None),
]


def build_demo_model(source: str, eval_source: str, batch_size: int, seed: int):
    """The demo DLRM over these Norm file lists, compiled (HugeCTR's DLRM sample, small)."""
    import tierserve.trainer as hugectr

    solver = hugectr.CreateSolver(
        model_name=MODEL_NAME,
        max_eval_batches=4,
        batchsize_eval=batch_size,
        batchsize=batch_size,
        lr=0.01,
        vvgpu=[[0]],
        repeat_dataset=True,
        i64_input_key=True,
        seed=seed,
    )
    reader = hugectr.DataReaderParams(
        data_reader_type=hugectr.DataReaderType_t.Norm,
        source=[source],
        eval_source=eval_source,
        check_type=hugectr.Check_t.Sum,
    )
    optimizer = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.Adam)
    model = hugectr.Model(solver, reader, optimizer)
    model.add(
        hugectr.Input(
            label_dim=1,
            label_name="label",
            dense_dim=DENSE_DIM,
            dense_name="dense",
            data_reader_sparse_param_array=[
                hugectr.DataReaderSparseParam("data1", 1, True, len(SLOT_SIZES))
            ],
        )
    )
    model.add(
        hugectr.SparseEmbedding(
            embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
            workspace_size_per_gpu_in_mb=8,
            embedding_vec_size=EMBEDDING_DIM,
            combiner="sum",
            sparse_embedding_name="sparse_embedding1",
            bottom_name="data1",
            optimizer=optimizer,
        )
    )
    for kind, bottom, top, out in DENSE_LAYERS:
        kwargs = {"num_output": out} if out is not None else {}
        model.add(
            hugectr.DenseLayer(
                layer_type=getattr(hugectr.Layer_t, kind),
                bottom_names=bottom,
                top_names=top,
                **kwargs,
            )
        )
    model.compile()
    return model


def _save(model, out: Path, iterations: int) -> tuple[Path, Path, list[Path]]:
    """Write the graph and the model files into a fresh ``out``: (graph, dense file,
    sparse folders)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    graph = out / f"{MODEL_NAME}.json"
    model.graph_to_json(str(graph))
    model.save_params_to_files(str(out / MODEL_NAME), iterations)
    dense = out / f"{MODEL_NAME}_dense_{iterations}.model"
    return graph, dense, [out / f"{MODEL_NAME}0_sparse_{iterations}.model"]


def ps_json(
    rocksdb_path: str,
    max_batch_size: int = 1024,
    volatile: dict | None = None,
    sparse_names: list[str] | None = None,
) -> dict:
    """The repository's ``ps.json``: a hash map in front of RocksDB, one model entry."""
    sparse_names = sparse_names or [f"{MODEL_NAME}0_sparse_0.model"]
    return {
        "supportlonglong": True,
        "volatile_db": volatile or {"type": "hash_map", "initial_cache_rate": 1.0},
        "persistent_db": {"type": "rocks_db", "path": rocksdb_path},
        "models": [
            {
                "model": MODEL_NAME,
                "sparse_files": [f"{MODEL_NAME}/1/{n}" for n in sparse_names],
                "dense_file": f"{MODEL_NAME}/1/{MODEL_NAME}_dense_0.model",
                "network_file": f"{MODEL_NAME}/1/{MODEL_NAME}.json",
                "max_batch_size": max_batch_size,
                "default_value_for_each_table": [0.0],
                "maxnum_des_feature_per_sample": DENSE_DIM,
                "maxnum_catfeature_query_per_table_per_sample": [len(SLOT_SIZES)],
                "embedding_vecsize_per_table": [EMBEDDING_DIM],
                "embedding_table_names": ["sparse_embedding1"],
                "gpucache": False,
                "label_dim": 1,
                "slot_num": len(SLOT_SIZES),
            }
        ],
    }


def write_repository(
    demo: DemoModel, repository: str | Path, version: int = 1, max_batch_size: int = 1024
) -> Path:
    """Copy the demo model into ``repository/dlrm/<version>/`` and write ``ps.json``, whose
    RocksDB tier lives beside the repository in ``<repository>.rocksdb``."""
    from tierserve.model import manifest
    from tierserve.model.version_folder import new_version

    repository = Path(repository)
    extras = list(demo.dense_file.parent.glob(demo.dense_file.name + ".*"))
    with new_version(repository / MODEL_NAME, version) as (_, staging):
        for path in (demo.graph, demo.dense_file, *extras):
            shutil.copy2(path, staging / path.name)
        for folder in demo.sparse_files:
            shutil.copytree(folder, staging / folder.name)
        manifest.copy_entries([demo.graph, demo.dense_file, *demo.sparse_files, *extras], staging)
    target = repository / MODEL_NAME / str(version)
    config = repository / "ps.json"
    if not config.exists():
        names = [p.name for p in demo.sparse_files]
        # Beside the repository, not in it: every folder in a repository is a model.
        data = ps_json(f"../{repository.name}.rocksdb", max_batch_size, sparse_names=names)
        data["models"][0]["dense_file"] = f"{MODEL_NAME}/{version}/{demo.dense_file.name}"
        config.write_text(json.dumps(data, indent=2) + "\n")
    return target
