"""``tierserve demo``: train a small model on generated data and serve it on 127.0.0.1.

The main job of the README: it generates a synthetic click log with a planted model, trains
a small DLRM with the embedded trainer, writes it into a model repository whose ``ps.json``
uses the in-process hash map and RocksDB tiers, and serves it over HTTP and gRPC.  The ports
are checked before anything is trained; every step prints a line at least every few seconds.
"""

from __future__ import annotations

import argparse


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "demo",
        help="train a small demo model on generated data and serve it on 127.0.0.1:8000",
        description=__doc__,
    )
    from tierserve.server.settings import Settings

    from .settings_options import add_setting, shown_default

    parser.add_argument("--workdir", default=".demo",
                        help="where data, model and RocksDB go (default .demo)")  # fmt: skip
    add_setting(parser, Settings, "host")
    add_setting(parser, Settings, "http_port", aliases=("--port",))
    add_setting(parser, Settings, "grpc_port", default_help="the HTTP port + 1, so "
                f"{int(shown_default(Settings, 'http_port')) + 1}")  # fmt: skip
    parser.add_argument(
        "--iterations", type=int, default=120, help="training iterations (default 120)"
    )
    parser.add_argument(
        "--exit-after-check",
        action="store_true",
        help="make one prediction over HTTP, print it and stop (for scripts and CI)",
    )
    parser.set_defaults(run=run)


def _say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def run(args: argparse.Namespace) -> int:
    import shutil
    import time
    from pathlib import Path

    from tierserve.server.app import BackgroundServer, check_ports, uses_native_grpc
    from tierserve.trainer.progress import heartbeat

    from .demo_model import train_demo_model, write_repository

    workdir = Path(args.workdir)
    repository = workdir / "repository"
    settings = demo_settings(args, repository)
    check_ports(settings)  # before minutes of training, not after
    transport = None
    if settings.grpc_port is not None:
        transport = "native (Rust)" if uses_native_grpc(settings) else "grpc.aio"
    started = time.monotonic()
    demo = train_demo_model(workdir / "train", iterations=args.iterations, say=_say)
    for old in (repository, repository.with_name(repository.name + ".rocksdb")):
        shutil.rmtree(old, ignore_errors=True)  # an earlier demo's model and tables
    _say(f"eval AUC {demo.eval_auc:.4f} over {demo.eval_batches} batches of held-out rows")
    write_repository(demo, repository)
    _say(
        f"model repository {repository} (hash_map + rocks_db tiers, see its ps.json); "
        f"RocksDB in {repository}.rocksdb, training data and checkpoints in {workdir / 'train'}"
    )
    server = BackgroundServer(settings)
    with heartbeat("[demo] loading the model and running one warm-up batch"):
        server.start(timeout=600)
    try:
        url = f"http://{server.http_url}"
        grpc = f" and {server.grpc_url} (gRPC, {transport} transport)" if transport else ""
        _say(f"serving on {url} (HTTP){grpc}, ready {time.monotonic() - started:.0f} s "
             "after the demo started")  # fmt: skip
        if transport == "grpc.aio":
            _say("the native gRPC transport is not installed: `make setup` builds it "
                 "(needs cargo); tierserve doctor shows it")  # fmt: skip
        _check(url, demo)
        if args.exit_after_check:
            return 0
        _say(f"try: curl {url}/v2/models/dlrm  (Ctrl-C stops)")
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0
    finally:
        server.stop()


def demo_settings(args: argparse.Namespace, repository):
    """The server settings of the demo: the options given, the gRPC port (unless given or
    ``--no-grpc``) the HTTP port + 1."""
    from tierserve.server.settings import Settings

    from .settings_options import settings_values

    values = settings_values(args, Settings)
    settings = Settings.from_env(model_repository=repository, **values)
    if "grpc_port" not in values:
        settings = Settings.from_env(
            model_repository=repository, **values, grpc_port=settings.http_port + 1
        )
    return settings


def _check(url: str, demo) -> None:
    """POST one row of the held-out data and print the click probability."""
    import json
    import time
    import urllib.request

    from .demo_model import MODEL_NAME

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
    sent = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as reply:
        answer = json.loads(reply.read())
    took = (time.perf_counter() - sent) * 1000
    score = answer["outputs"][0]["data"][0]
    _say(f"POST {url}/v2/models/{MODEL_NAME}/infer")
    _say(f"  request:  {json.dumps(body)}")
    _say(f"  click probability: {score:.6f} (label in the data: {batch.label[0, 0]:g}; "
         f"answered in {took:.1f} ms)")  # fmt: skip


def _one_row(demo):
    from tierserve.model.graph_json import load_graph_json
    from tierserve.trainer.hugectr.inference_data import epoch_batches

    return epoch_batches(load_graph_json(demo.graph), demo.eval_source, "Norm", "Sum", None, 1)
