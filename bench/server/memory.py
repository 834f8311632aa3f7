"""Memory of ``tierserve serve --workers N``: total PSS of the parent and its workers.

    python -m bench.server.memory                      # 10M rows x dim 16, --workers 1 and 2
    python -m bench.server.memory --rows 2000000 --workers 1,2,4
    python -m bench.server.memory --dense-mb 256       # a ranking model, 256 MiB dense file

Serves one embedding-lookup model (a version folder with one sparse table of ``--rows`` random
rows, a ``hash_map`` tier) and, once the server is ready and has answered a lookup, sums the
proportional set size (``Pss`` of ``/proc/PID/smaps_rollup``: shared pages divided among the
processes that map them, so the total counts every page once; RSS would count shared pages
once per process) over the server process and every process below it.  Prints the total per
worker count and its ratio to one worker's.  ``--dense-mb`` serves a ranking model instead:
the demo DLRM with a hidden layer widened until its dense file is about that size (random
weights), to measure what the dense weights cost per worker.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.server.run import _descendants


def pss_mib(pid: int) -> float:
    """Total PSS, in MiB, of ``pid`` and its descendants."""
    total = 0
    for p in _descendants(pid):
        try:
            text = Path(f"/proc/{p}/smaps_rollup").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("Pss:"):
                total += int(line.split()[1])
    return total / 1024


def make_repository(root: Path, rows: int, dim: int, volatile: str = "hash_map") -> Path:
    from tierserve.ps.sparse_file import write_sparse_model

    rng = np.random.default_rng(0)
    folder = root / "emb" / "1" / "emb0_sparse_0.model"
    folder.parent.mkdir(parents=True)
    keys = rng.permutation(rows * 4)[:rows].astype(np.int64)
    write_sparse_model(folder, keys, rng.standard_normal((rows, dim), dtype=np.float32))
    ps = {
        "supportlonglong": True,
        "volatile_db": {"type": volatile, **(
            {"shared_memory_name": f"tierserve-bench-{root.parent.name}"}
            if volatile == "multi_process_hash_map" else {}
        )},
        "models": [{
            "model": "emb", "sparse_files": [folder.name], "dense_file": "", "network_file": "",
            "max_batch_size": 64, "embedding_vecsize_per_table": [dim],
            "embedding_table_names": ["table0"],
            "maxnum_catfeature_query_per_table_per_sample": [1], "gpucache": False,
        }],
    }  # fmt: skip
    (root / "ps.json").write_text(json.dumps(ps))
    return root


def make_ranking_repository(root: Path, dense_mb: int) -> Path:
    """The demo DLRM (a few training steps) with one more hidden layer, wide enough that the
    dense file is about ``dense_mb`` MiB, filled with random weights; a hash map tier."""
    import warnings

    from tierserve.clients.demo_model import train_demo_model, write_repository
    from tierserve.model.dense_file import write_dense_file
    from tierserve.model.graph_json import load_graph_json
    from tierserve.model.inference_graph import dense_layers, input_shapes
    from tierserve.model.network import DenseNetwork

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no GPU: the trainer says so
        demo = train_demo_model(root.parent / "train", iterations=2, batch_size=64,
                                num_samples=1024)  # fmt: skip
    write_repository(demo, root)
    version = root / "dlrm" / "1"
    (version / "tierserve.manifest").unlink()  # the graph and weights are rewritten below
    graph_path = version / demo.graph.name
    data = json.loads(graph_path.read_text())
    width = max(64, int((dense_mb * 2**20 / 4) ** 0.5))
    layers = data["layers"]
    at = next(i for i, layer in enumerate(layers) if layer["name"] == "relu3")
    layers[at - 1]["fc_param"]["num_output"] = width
    layers[at + 1: at + 1] = [
        {"name": "fc_wide", "type": "InnerProduct", "bottom": "relu3", "top": "fc_wide",
         "fc_param": {"num_output": width}},
        {"name": "relu_wide", "type": "ReLU", "bottom": "fc_wide", "top": "relu_wide"},
    ]  # fmt: skip
    layers[at + 3]["bottom"] = "relu_wide"
    graph_path.write_text(json.dumps(data))
    graph = load_graph_json(graph_path)
    shapes = DenseNetwork(dense_layers(graph), input_shapes(graph)).flat_param_shapes()
    rng = np.random.default_rng(0)
    dense = version / demo.dense_file.name
    write_dense_file(dense, [rng.standard_normal(s, dtype=np.float32) * 0.01 for s in shapes])
    config = json.loads((root / "ps.json").read_text())
    config.pop("persistent_db", None)
    config["volatile_db"] = {"type": "hash_map"}
    (root / "ps.json").write_text(json.dumps(config))
    print(f"ranking model: hidden width {width}, dense file {dense.stat().st_size / 2**20:,.0f} "
          "MiB")  # fmt: skip
    return root


RANKING_BODY = {"inputs": [
    {"name": "DES", "datatype": "FP32", "shape": [1, 13], "data": [0.5] * 13},
    {"name": "CATCOLUMN", "datatype": "INT64", "shape": [1, 8], "data": list(range(1, 9))},
]}  # fmt: skip
STORE_BODY = {"inputs": [
    {"name": "KEYS", "datatype": "INT64", "shape": [4], "data": [1, 2, 3, 4]},
    {"name": "NUMKEYS", "datatype": "INT32", "shape": [1], "data": [4]},
]}  # fmt: skip


def measure(repo: Path, workers: int, model: str = "emb", body: dict = STORE_BODY) -> float:
    import httpx

    from tierserve.server.app import free_port

    http = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tierserve.clients.cli", "serve", "--model-repository", str(repo),
         "--workers", str(workers), "--http-port", str(http), "--no-grpc", "--poll-interval", "0",
         "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                if (
                    httpx.get(f"http://127.0.0.1:{http}/v2/health/ready", timeout=2).status_code
                    == 200
                ):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"--workers {workers}: the server did not become ready")
            time.sleep(0.5)
        for _ in range(8):  # several connections: every worker answers once
            r = httpx.post(f"http://127.0.0.1:{http}/v2/models/{model}/infer", json=body,
                           timeout=30)  # fmt: skip
            r.raise_for_status()
        time.sleep(1.0)
        return pss_mib(proc.pid)
    finally:
        proc.terminate()
        proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--workers", default="1,2", help="worker counts to measure")
    parser.add_argument(
        "--volatile", default="hash_map,multi_process_hash_map",
        help="volatile tiers to measure (comma-separated)",
    )  # fmt: skip
    parser.add_argument("--dense-mb", type=int, default=0,
                        help="serve a ranking model with a dense file of about this size")  # fmt: skip
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    if args.dense_mb:
        with tempfile.TemporaryDirectory() as tmp:
            repo = make_ranking_repository(Path(tmp) / "repo", args.dense_mb)
            first = None
            for workers in counts:
                total = measure(repo, workers, "dlrm", RANKING_BODY)
                first = first or total
                print(f"ranking, --workers {workers}: total PSS {total:,.0f} MiB "
                      f"({total / first:.2f}x)", flush=True)  # fmt: skip
        return 0
    raw = args.rows * (8 + 4 * args.dim) / 2**20
    print(f"{args.rows:,} rows x dim {args.dim} ({raw:,.0f} MiB of keys and vectors)")
    for volatile in args.volatile.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            repo = make_repository(Path(tmp) / "repo", args.rows, args.dim, volatile)
            first = None
            for workers in counts:
                total = measure(repo, workers)
                first = first or total
                print(f"{volatile}, --workers {workers}: total PSS {total:,.0f} MiB "
                      f"({total / first:.2f}x)", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
