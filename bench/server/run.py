"""Benchmark of the server against InferenceModel.predict in the same run.

    python -m bench.server.run                    # the trainer's DLRM (26 slots x 2000, dim 16)
    python -m bench.server.run --quick            # fewer requests

1. Trains the trainer issue's DLRM (``tests/trainer/scripts/dlrm.py``) for a few iterations and
   writes it into a model repository (hash map tier).
2. Times ``InferenceModel.predict_batch`` on fixed batches of 1, 64 and 1024 rows (the peer).
3. Starts ``tierserve serve`` in a subprocess and sends the same batches, one client, over HTTP
   (tritonclient.http, binary tensors) and gRPC (tritonclient.grpc): throughput and p50/p99.
   Overhead = end-to-end p50 minus predict p50, over predict p50.
4. 64 concurrent batch-1 clients (gRPC, asyncio) against the server with dynamic batching on
   and again with it off: throughput ratio.

Prints a table (and with ``--json FILE`` writes the figures there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The server runs one BLAS thread per inference thread (tierserve serve's default); the peer
# gets the same, set before numpy loads.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BATCHES = (1, 64, 1024)


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
    }
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, str(ROOT / "tests" / "trainer" / "scripts" / "dlrm.py")],
        env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=workdir,
    )  # fmt: skip
    return out


def make_repository(out: Path, iterations: int, repo: Path, volatile: dict | None = None) -> Path:
    version = repo / "dlrm" / "1"
    version.mkdir(parents=True)
    shutil.copy2(out / "dlrm.json", version / "dlrm.json")
    shutil.copy2(out / f"dlrm_dense_{iterations}.model", version)
    shutil.copytree(out / f"dlrm0_sparse_{iterations}.model",
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
    from tierserve.server.datasets import wrapped_batches
    from tierserve.trainer.graph_json import load_graph_json

    graph = load_graph_json(version / "dlrm.json")
    big = next(iter(wrapped_batches(graph, str(data_dir / "file_list_test.txt"), "Norm", "Sum",
                                    None, max(BATCHES), 1)))  # fmt: skip
    cat = big.sparse[0].keys.reshape(big.batch_size, -1)
    return {
        b: (np.ascontiguousarray(big.dense[:b]), np.ascontiguousarray(cat[:b])) for b in BATCHES
    }


def _stats(times: list[float], rows: int) -> dict:
    times = sorted(times)
    p50 = times[len(times) // 2]
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    return {"p50_ms": p50 * 1e3, "p99_ms": p99 * 1e3, "rows_per_s": rows / statistics.mean(times)}


def predictor(version: Path, volatile: dict | None = None):
    """InferenceModel over the version's files and a function that predicts (dense, keys)."""
    from tierserve.server.inference_model import InferenceModel, InferenceParams
    from tierserve.trainer.data.batch import Batch, SparseInput

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


def client_call(protocol: str, url: str):
    """A function that sends (dense, keys) over ``protocol`` and returns OUTPUT0."""
    if protocol == "http":
        import tritonclient.http as mod
    else:
        import tritonclient.grpc as mod
    client = mod.InferenceServerClient(url)

    def call(des, cat):
        a = mod.InferInput("DES", list(des.shape), "FP32")
        a.set_data_from_numpy(des)
        k = mod.InferInput("CATCOLUMN", list(cat.shape), "INT64")
        k.set_data_from_numpy(cat)
        return client.infer("dlrm", [a, k]).as_numpy("OUTPUT0")

    return call


def interleaved(paths: dict, data: dict, repeats: dict, rounds: int = 5) -> dict:
    """Per batch size, each path in turn for ``repeats[b] / rounds`` calls, ``rounds`` times,
    so machine noise falls on every path alike."""
    out: dict = {name: {} for name in paths}
    for b, (des, cat) in data.items():
        samples: dict = {name: [] for name in paths}
        for fn in paths.values():
            for _ in range(3):
                fn(des, cat)
        for _ in range(rounds):
            for name, fn in paths.items():
                for _ in range(max(1, repeats[b] // rounds)):
                    t0 = time.perf_counter()
                    fn(des, cat)
                    samples[name].append(time.perf_counter() - t0)
        for name in paths:
            out[name][b] = _stats(samples[name], b)
    return out


def start_server(
    repo: Path, http: int, grpc: int, batching: bool, extra: tuple[str, ...] = ()
) -> subprocess.Popen:
    """``tierserve serve`` in a subprocess, once it answers."""
    import tritonclient.http as th

    args = [sys.executable, "-m", "tierserve.clients.cli", "serve", "--model-repository",
            str(repo), "--http-port", str(http), "--grpc-port", str(grpc), "--poll-interval", "0",
            "--log-level", "warning"]  # fmt: skip
    if not batching:
        args.append("--no-dynamic-batching")
    args.extend(extra)
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if th.InferenceServerClient(f"127.0.0.1:{http}").is_server_ready():
                return proc
        except Exception:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start")


def concurrent_throughput(url: str, data: dict, clients: int, seconds: float) -> float:
    """Rows per second of ``clients`` concurrent batch-1 gRPC clients (asyncio)."""
    import tritonclient.grpc.aio as tga

    des, cat = data[1]

    async def main() -> int:
        client = tga.InferenceServerClient(url)
        a = tga.InferInput("DES", list(des.shape), "FP32")
        a.set_data_from_numpy(des)
        k = tga.InferInput("CATCOLUMN", list(cat.shape), "INT64")
        k.set_data_from_numpy(cat)
        done = 0
        stop = time.perf_counter() + seconds

        async def worker():
            nonlocal done
            while time.perf_counter() < stop:
                await client.infer("dlrm", [a, k])
                done += 1

        await asyncio.gather(*(worker() for _ in range(clients)))
        await client.close()
        return done

    started = time.perf_counter()
    done = asyncio.run(main())
    return done / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--iterations", type=int, default=50, help="training iterations")
    parser.add_argument("--seconds", type=float, default=8.0, help="concurrency test length")
    parser.add_argument(
        "--volatile", choices=["hash_map", "redis_cluster"], default="hash_map",
        help="volatile tier; redis_cluster starts a three-node cluster on loopback with the "
        "test suite's helpers (tests/services)",
    )  # fmt: skip
    args = parser.parse_args()
    scale = 0.3 if args.quick else 1.0
    repeats = {1: int(1000 * scale), 64: int(400 * scale), 1024: int(100 * scale)}
    from tierserve.server.app import free_port

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print("training the trainer's DLRM ...", flush=True)
        out = train(work, args.iterations)
        repo = work / "repo"
        cluster, volatile = None, None
        if args.volatile == "redis_cluster":
            sys.path.insert(0, str(ROOT / "tests"))
            from services.redis import RedisCluster, ensure_redis

            ensure_redis()
            dirs = [work / f"redis-{i}" for i in range(3)]
            for d in dirs:
                d.mkdir()
            cluster = RedisCluster(dirs, [work / f"redis-{i}.log" for i in range(3)])
            cluster.start()
            volatile = {"type": "redis_cluster", "address": cluster.addresses}
        version = make_repository(out, args.iterations, repo, volatile)
        data = batches_from(version, work / "data")
        results: dict = {"cpu_count": os.cpu_count(), "volatile": args.volatile}
        model, predict = predictor(version, volatile)
        http, grpc = free_port(), free_port()
        proc = start_server(repo, http, grpc, batching=True)
        try:
            check = client_call("grpc", f"127.0.0.1:{grpc}")(*data[64])
            assert np.abs(check - predict(*data[64])).max() <= 1e-5, "server != predict"
            paths = {
                "predict": predict,
                "http": client_call("http", f"127.0.0.1:{http}"),
                "grpc": client_call("grpc", f"127.0.0.1:{grpc}"),
            }
            results.update(interleaved(paths, data, repeats))
            results["concurrent_batched_rows_s"] = concurrent_throughput(
                f"127.0.0.1:{grpc}", data, 64, args.seconds)  # fmt: skip
        finally:
            proc.terminate()
            proc.wait()
            model.close()
        http, grpc = free_port(), free_port()
        proc = start_server(repo, http, grpc, batching=False)
        try:
            results["concurrent_unbatched_rows_s"] = concurrent_throughput(
                f"127.0.0.1:{grpc}", data, 64, args.seconds)  # fmt: skip
        finally:
            proc.terminate()
            proc.wait()
            if cluster is not None:
                cluster.stop()

    print(f"\nCPU cores: {results['cpu_count']}, volatile tier: {args.volatile}")
    print(f"{'path':<10}{'batch':>6}{'rows/s':>12}{'p50 ms':>9}{'p99 ms':>9}{'overhead':>10}")
    for path in ("predict", "http", "grpc"):
        for b in BATCHES:
            r = results[path][b]
            base = results["predict"][b]["p50_ms"]
            over = "" if path == "predict" else f"{(r['p50_ms'] - base) / base:>9.0%}"
            print(f"{path:<10}{b:>6}{r['rows_per_s']:>12,.0f}{r['p50_ms']:>9.3f}"
                  f"{r['p99_ms']:>9.3f}{over:>10}")  # fmt: skip
    ratio = results["concurrent_batched_rows_s"] / results["concurrent_unbatched_rows_s"]
    results["batching_speedup"] = ratio
    print(
        f"64 concurrent batch-1 gRPC clients: {results['concurrent_batched_rows_s']:,.0f} rows/s "
        f"batched, {results['concurrent_unbatched_rows_s']:,.0f} unbatched ({ratio:.1f}x)"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps({str(k): v for k, v in results.items()}, indent=2, default=str)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
