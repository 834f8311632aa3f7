"""GPU serving stage: the DLRM trained with ``vvgpu=[[0]]`` served by ``InferenceModel``, with
the GPU embedding cache and without it (the CPU path: every key from the hash map).

Trains ``tests/trainer/scripts/dlrm.py`` (``bench.server.run``'s model: 26 tables x dim 16,
~1M keys, MLPs 512-256) for a few iterations on the GPU, writes the model repository as
``bench.server.run`` does (hash_map tier, every key of the table), then times
``InferenceModel.predict_batch`` at batch 1, 64 and 1024 on real rows of the eval file, the
two models alternating; p50 and p99 per batch size.  With the GPU cache the dense network runs
on the GPU too (``InferenceModel`` follows the cache); the CPU path runs it with numpy.  Goal: batch-1024 p50 with the GPU cache
at least 2x lower than the CPU path.  The cache holds 50% of the rows (``gpucacheper``) and is
warmed by the timed batches before timing.

With ``--cpu-dry-run`` the model trains on numpy for fewer iterations and the "GPU" cache is
the host (numpy) cache.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from .backend import Backend, log

ROOT = Path(__file__).resolve().parents[2]


def train(workdir: Path, iterations: int, gpu: bool, dry_run: bool) -> Path:
    from bench.server.run import MODEL_ENV

    out = workdir / "out"
    env = {**os.environ, "DATA_DIR": str(workdir / "data"), "OUT_DIR": str(out),
           "MAX_ITER": str(iterations), "BATCH": "1024", "EVAL_BATCHES": "1", "NUM_FILES": "2",
           "TIERSERVE_NO_PROGRESS": "1", **MODEL_ENV}
    if dry_run:
        env.update(SLOT_SIZES=",".join(["400"] * 26), SAMPLES_PER_FILE="4096", BOTTOM="64,32",
                   TOP="64,32")
    env.pop("TIERSERVE_FORCE_CPU", None)
    if not gpu:
        env["TIERSERVE_FORCE_CPU"] = "1"
    out.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, str(ROOT / "tests/trainer/scripts/dlrm.py")], env=env,
                          cwd=workdir, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"dlrm.py failed ({done.returncode}): {done.stderr[-2000:]}")
    return out


def make_repository(out: Path, iterations: int, repo: Path, dry_run: bool) -> Path:
    import json
    import shutil

    from bench.server.run import make_repository as full_repository
    from tierserve.ps.sparse_file import read_sparse_model, write_sparse_model

    if not dry_run:
        return full_repository(out, iterations, repo)
    version = repo / "dlrm" / "1"  # tiny model: the trained table as it is
    version.mkdir(parents=True)
    for name in ("dlrm.json", f"dlrm_dense_{iterations}.model"):
        shutil.copy2(out / name, version / name)
    table = read_sparse_model(out / f"dlrm0_sparse_{iterations}.model")
    write_sparse_model(version / f"dlrm0_sparse_{iterations}.model", np.asarray(table.keys),
                       np.asarray(table.embeddings))
    (repo / "ps.json").write_text(json.dumps({"models": []}))
    return version


def predictor(version: Path, gpu_cache: bool):
    from tierserve.model.batch import Batch, SparseInput
    from tierserve.server.inference_model import InferenceModel, InferenceParams

    dense_file = next(version.glob("*_dense_*.model"))
    sparse = sorted(str(p) for p in version.glob("*_sparse_*.model"))
    params = InferenceParams("dlrm", 1024, 0.9, str(dense_file), sparse, gpu_cache, 0.5, True,
                             volatile_db={"type": "hash_map"})
    model = InferenceModel(str(version / "dlrm.json"), params)

    def predict(des, cat):
        b = des.shape[0]
        batch = Batch(label=np.zeros((b, 1), np.float32), dense=des,
                      sparse=(SparseInput(cat.reshape(-1), np.arange(cat.size + 1), cat.shape[1]),))
        return model.predict_batch(batch)

    return model, predict


def run(be: Backend, dry_run: bool) -> dict:
    from bench.server.run import BATCHES, batches_from

    iterations = 5 if dry_run else 20
    with tempfile.TemporaryDirectory(prefix="gpu-check-server-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        out = train(tmp, iterations, be.gpu, dry_run)
        log(f"server: trained {iterations} iterations in {time.perf_counter() - t0:.1f}s")
        version = make_repository(out, iterations, tmp / "repo", dry_run)
        data = batches_from(version, tmp / "data")
        models = {}
        try:
            models["CPU path (no cache)"] = predictor(version, False)
            models["GPU cache" if be.gpu else "host cache (dry run)"] = predictor(version, True)
            cache = next(iter(models.values()))[0].cache
            assert cache is None, "the CPU path has a cache"
            gpu_model = list(models.values())[1][0]
            devices = {getattr(c, "device", "?") for c in _caches(gpu_model)}
            if be.gpu:
                assert devices == {"cuda:0"}, f"the GPU cache is on {devices}"
                assert gpu_model.xp is be.xp, "the dense network is not on the GPU"
            outputs = {}
            for name, (_, predict) in models.items():  # warm: caches fill, kernels compile
                for _ in range(3):
                    for b in BATCHES:
                        outputs[(name, b)] = predict(*data[b])
            names = list(models)
            for b in BATCHES:
                np.testing.assert_allclose(outputs[(names[0], b)], outputs[(names[1], b)],
                                           rtol=1e-5, atol=1e-6)
            repeats = {1: 200, 64: 100, 1024: 30} if not dry_run else {1: 20, 64: 10, 1024: 5}
            times = {(n, b): [] for n in models for b in BATCHES}
            for b in BATCHES:
                for _ in range(repeats[b]):
                    for name, (_, predict) in models.items():
                        t = time.perf_counter()
                        predict(*data[b])
                        times[(name, b)].append(time.perf_counter() - t)
            result = {"iterations": iterations, "cache_devices": sorted(devices), "latency": {}}
            for (name, b), ts in times.items():
                ts.sort()
                result["latency"].setdefault(name, {})[str(b)] = {
                    "p50_ms": ts[len(ts) // 2] * 1e3,
                    "p99_ms": ts[min(len(ts) - 1, int(len(ts) * 0.99))] * 1e3,
                    "rows_per_s": b / (sum(ts) / len(ts)),
                }
                log(f"server {name} batch {b}: p50 {ts[len(ts) // 2] * 1e3:.2f} ms")
            return result
        finally:
            for model, _ in models.values():
                model.close()


def _caches(model) -> list:
    """The EmbeddingCache of each of the model's tables."""
    if model.cache is None:
        return []
    return [model.cache.cache(i) for i in range(len(model.table_names))]
