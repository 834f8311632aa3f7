"""The model ``bench.server.run`` serves and its peer: the trainer issue's DLRM (26 tables of
dim 16, ~1M keys, MLPs 512-256) trained for a few iterations by the trainer's script, written
into a model repository with every key of its table, the test batches of 1, 64 and 1024
rows, and ``InferenceModel.predict_batch`` over the same files (the peer)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BATCHES = (1, 64, 1024)
# The trainer issue's DLRM (bench.trainer.run): 26 tables x dim 16, ~1M keys, MLPs 512-256.
SLOTS = 26
KEYS = 1_000_000
MODEL_ENV = {
    "EMB_DIM": "16",
    "BOTTOM": "512,256",
    "TOP": "512,256",
    "SLOT_SIZES": ",".join([str(KEYS // SLOTS)] * SLOTS),
    "WORKSPACE_MB": "512",
}


def train(workdir: Path, iterations: int) -> Path:
    """Run the trainer's DLRM script; returns its output folder."""
    out = workdir / "out"
    env = {
        **os.environ,
        "DATA_DIR": str(workdir / "data"),
        "OUT_DIR": str(out),
        "MAX_ITER": str(iterations),
        "BATCH": "1024",
        "EVAL_BATCHES": "1",
        "NUM_FILES": "2",
        "TIERSERVE_FORCE_CPU": "1",
        **MODEL_ENV,
    }
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, str(ROOT / "tests" / "trainer" / "scripts" / "dlrm.py")],
        env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=workdir,
    )  # fmt: skip
    return out


def full_table(trained: Path, target: Path) -> int:
    """Write the trained sparse file to ``target`` with every key of the model's ~1M: the
    trained vectors, and random ones (the trainer's scale) for keys training never saw."""
    from tierserve.ps.sparse_file import read_sparse_model, write_sparse_model

    table = read_sparse_model(trained)
    total = (KEYS // SLOTS) * SLOTS
    keys = np.arange(total, dtype=np.int64)
    rng = np.random.default_rng(0)
    vectors = rng.uniform(-0.05, 0.05, (total, table.embeddings.shape[1])).astype(np.float32)
    known = np.asarray(table.keys, dtype=np.int64)
    inside = (known >= 0) & (known < total)
    vectors[known[inside]] = np.asarray(table.embeddings)[inside]
    extra = known[~inside]  # none expected: the generator draws keys below the slot sizes
    if extra.size:
        keys = np.concatenate([keys, extra])
        vectors = np.concatenate([vectors, np.asarray(table.embeddings)[~inside]])
    write_sparse_model(target, keys, vectors)
    return int(keys.size)


def make_repository(out: Path, iterations: int, repo: Path, volatile: dict | None = None) -> Path:
    version = repo / "dlrm" / "1"
    version.mkdir(parents=True)
    shutil.copy2(out / "dlrm.json", version / "dlrm.json")
    shutil.copy2(out / f"dlrm_dense_{iterations}.model", version)
    full_table(out / f"dlrm0_sparse_{iterations}.model",
               version / f"dlrm0_sparse_{iterations}.model")  # fmt: skip
    graph = json.loads((out / "dlrm.json").read_text())
    slots = graph["layers"][0]["sparse"][0]["slot_num"]
    ps = {
        "supportlonglong": True,
        "volatile_db": volatile or {"type": "hash_map"},
        "models": [{
            "model": "dlrm",
            "sparse_files": [f"dlrm0_sparse_{iterations}.model"],
            "dense_file": f"dlrm_dense_{iterations}.model",
            "network_file": "dlrm.json",
            "max_batch_size": 1024,
            "maxnum_des_feature_per_sample": 13,
            "maxnum_catfeature_query_per_table_per_sample": [slots],
            "embedding_vecsize_per_table": [16],
            "embedding_table_names": ["sparse_embedding1"],
            "gpucache": False,
            "slot_num": slots,
        }],
    }  # fmt: skip
    (repo / "ps.json").write_text(json.dumps(ps, indent=2))
    return version


def batches_from(version: Path, data_dir: Path):
    from tierserve.model.graph_json import load_graph_json
    from tierserve.trainer.hugectr.inference_data import wrapped_batches

    graph = load_graph_json(version / "dlrm.json")
    big = next(iter(wrapped_batches(graph, str(data_dir / "file_list_test.txt"), "Norm", "Sum",
                                    None, max(BATCHES), 1)))  # fmt: skip
    cat = big.sparse[0].keys.reshape(big.batch_size, -1)
    return {
        b: (np.ascontiguousarray(big.dense[:b]), np.ascontiguousarray(cat[:b])) for b in BATCHES
    }


def predictor(version: Path, volatile: dict | None = None):
    """InferenceModel over the version's files and a function that predicts (dense, keys)."""
    from tierserve.model.batch import Batch, SparseInput
    from tierserve.server.inference_model import InferenceModel, InferenceParams

    dense_file = next(version.glob("*_dense_*.model"))
    sparse = sorted(str(p) for p in version.glob("*_sparse_*.model"))
    params = InferenceParams("dlrm", 1024, 0.9, str(dense_file), sparse, False, 0.5, True,
                             volatile_db=volatile or {"type": "hash_map"})  # fmt: skip
    model = InferenceModel(str(version / "dlrm.json"), params)

    def predict(des, cat):
        b = des.shape[0]
        batch = Batch(
            label=np.zeros((b, 1), np.float32), dense=des,
            sparse=(SparseInput(cat.reshape(-1), np.arange(cat.size + 1), cat.shape[1]),),
        )  # fmt: skip
        return model.predict_batch(batch)

    return model, predict
