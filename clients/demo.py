"""``tierserve demo``: train a small model on generated data and serve it on 127.0.0.1.

The main job of the README: it generates a synthetic click log with a planted model, trains
a small DLRM with the embedded trainer, writes it into a model repository whose ``ps.json``
uses the in-process hash map and RocksDB tiers, and serves it over HTTP and gRPC.
"""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "demo",
        help="train a small demo model on generated data and serve it on 127.0.0.1:8000",
        description=__doc__,
    )
    parser.add_argument("--workdir", default=".demo", help="where data, model and RocksDB go")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    parser.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    parser.add_argument(
        "--iterations", type=int, default=120, help="training iterations (default 120)"
    )
    parser.add_argument(
        "--exit-after-check",
        action="store_true",
        help="make one prediction over HTTP, print it and stop (for scripts and CI)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import json
    import shutil
    import time
    import urllib.request
    from pathlib import Path

    from tierserve.server.app import BackgroundServer
    from tierserve.server.settings import Settings

    from .demo_model import MODEL_NAME, train_demo_model, write_repository

    workdir = Path(args.workdir)
    print(f"[demo] training a small DLRM on generated data in {workdir} ...", flush=True)
    demo = train_demo_model(workdir / "train", iterations=args.iterations)
    repository = workdir / "repository"
    for old in (repository, repository.with_name(repository.name + ".rocksdb")):
        shutil.rmtree(old, ignore_errors=True)  # an earlier demo's model and tables
    print(f"[demo] eval AUC {demo.eval_auc:.4f} over {demo.eval_batches} batches of held-out rows")
    write_repository(demo, repository)
    print(
        f"[demo] model repository {repository} (hash_map + rocks_db tiers, see its ps.json); "
        f"RocksDB in {repository}.rocksdb, training data and checkpoints in {workdir / 'train'}"
    )
    settings = Settings.from_env(
        model_repository=repository, host=args.host, http_port=args.port, grpc_port=args.port + 1
    )
    with BackgroundServer(settings) as server:
        url = f"http://{server.http_url}"
        print(f"[demo] serving on {url} (HTTP) and {server.grpc_url} (gRPC)")
        batch = next(iter(_one_row(demo)))
        body = {
            "inputs": [
                {"name": "DES", "datatype": "FP32", "shape": [1, batch.dense.shape[1]],
                 "data": batch.dense[0].tolist()},
                {"name": "CATCOLUMN", "datatype": "INT64", "shape": [1, batch.sparse[0].slot_num],
                 "data": batch.sparse[0].keys.tolist()},
            ]
        }  # fmt: skip
        request = urllib.request.Request(
            f"{url}/v2/models/{MODEL_NAME}/infer",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            answer = json.loads(reply.read())
        score = answer["outputs"][0]["data"][0]
        print(f"[demo] POST {url}/v2/models/{MODEL_NAME}/infer")
        print(f"[demo]   request:  {json.dumps(body)}")
        print(f"[demo]   click probability: {score:.6f} (label in the data: {batch.label[0, 0]:g})")
        if args.exit_after_check:
            return 0
        print("[demo] try: curl " + url + "/v2/models/" + MODEL_NAME + "  (Ctrl-C stops)")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0


def _one_row(demo):
    from tierserve.server.datasets import epoch_batches
    from tierserve.trainer.graph_json import load_graph_json

    return epoch_batches(load_graph_json(demo.graph), demo.eval_source, "Norm", "Sum", None, 1)
