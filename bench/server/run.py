"""Benchmark of the server against InferenceModel.predict in the same run.

    python -m bench.server.run                    # the trainer issue's DLRM (see 1.)
    python -m bench.server.run --quick            # fewer requests
    python -m bench.server.run --train-dir /tmp/b # keep the trained model for the next run
    python -m bench.server.run --volatile redis_cluster

1. Trains the trainer issue's DLRM (``tests/trainer/scripts/dlrm.py`` with 26 tables of dim 16,
   ~1M keys in all, power-law keys, bottom MLP 13-512-256-16, top MLP 512-256-1; the same model
   as ``bench.trainer.run``) for a few iterations and writes it into a model repository (hash
   map tier).  The sparse file then holds every key of the ~1M (vectors the few training
   iterations never touched are drawn at random), so the tier is as large as the model's.
2. Times ``InferenceModel.predict_batch`` on fixed batches of 1, 64 and 1024 rows (the peer).
   The peer's process gets the malloc settings ``tierserve serve`` gives itself
   (``server/runtime/allocator.py``; ``--no-malloc-tuning`` leaves both at glibc's defaults) and its
   BLAS thread count (1, or what ``--server-args`` gives ``--blas-threads``).
3. Starts ``tierserve serve`` in a subprocess and sends the same batches, one client, over HTTP
   (tritonclient.http, binary tensors) and gRPC (tritonclient.grpc): throughput and p50/p99.
   Overhead = end-to-end p50 minus predict p50, over predict p50.  The ``-raw`` paths send
   the same requests built once and read the replies without tritonclient: the server's and
   the connection's share alone.
4. 64 concurrent batch-1 clients against the server with dynamic batching on and a second one
   with it off, in alternating turns: throughput ratio, over gRPC and over HTTP.  The load
   generator must cost little CPU per request, since it shares the cores with the server:
   :mod:`bench.server.loadgen` sends real KServe v2 requests (the same bytes tritonclient
   sends, built once), by default with the native ``wrk`` (64 HTTP/1.1 keep-alive
   connections, binary tensor extension) and ``h2load`` (64 HTTP/2 connections, one call in
   flight on each), ``--loadgen python`` with asyncio in this process; every reply is checked
   (a run with a failed one stops the benchmark).  It is the same for batched and unbatched.
5. The same load against servers that answer without doing any work (``bench.server.floors``:
   uvicorn + httptools, and grpc.aio): the transport's own CPU per request.  The unbatched
   server's CPU per request over that floor plus predict's time per row at batch 64 bounds
   the ratio of 4. while the server is bound by its CPU: batching shrinks the model's share
   of a request to that, and the transport's share not at all.

Prints a table (and with ``--json FILE`` writes the figures there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

# The server runs one BLAS thread per inference thread (tierserve serve's default); the peer
# gets the same, set before numpy loads.
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402

from bench.redis_cluster import start_redis_cluster  # noqa: E402
from bench.server import clients  # noqa: E402
from bench.server.clients import (  # noqa: E402
    add_load_arguments,
    client_call,
    concurrent_load,
    concurrent_throughput,
    grpc_request_bytes,
    http_request,
    http_request_bytes,
    interleaved,
    prebuilt_call,
    use_load_arguments,
)
from bench.server.measure import concurrency_runs, floor_runs, model_share  # noqa: E402
from bench.server.model import (  # noqa: E402
    BATCHES,
    KEYS,
    MODEL_ENV,
    ROOT,
    SLOTS,
    batches_from,
    full_table,
    make_repository,
    predictor,
    train,
)
from bench.server.process import (  # noqa: E402
    QUIET_CORES,
    _descendants,
    _with_workers,
    cpu_by_process,
    executions,
    machine_busy,
    match_server_blas_threads,
    server_cpu,
    snapshot,
    start_server,
)
from bench.server.report import report  # noqa: E402

#: the benchmark's parts, by the names the other benches (bench.triton, bench.gpu, ...) use
__all__ = [
    "BATCHES", "KEYS", "MODEL_ENV", "QUIET_CORES", "ROOT", "SLOTS", "_descendants",
    "_with_workers", "add_load_arguments", "batches_from", "client_call", "concurrency_runs",
    "concurrent_load", "concurrent_throughput", "cpu_by_process", "executions", "floor_runs",
    "full_table", "grpc_request_bytes", "http_request", "http_request_bytes", "interleaved",
    "machine_busy", "main", "make_repository", "match_server_blas_threads", "model_share",
    "prebuilt_call", "predictor", "server_cpu", "snapshot", "start_server", "train",
    "use_load_arguments",
]  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--iterations", type=int, default=50, help="training iterations")
    parser.add_argument("--seconds", type=float, default=8.0, help="concurrency test length")
    parser.add_argument(
        "--turns", type=int, default=4,
        help="turns the concurrency test length is split into (each whole seconds long with "
        "the native load generator)",
    )  # fmt: skip
    parser.add_argument(
        "--train-dir", default=None,
        help="keep the trained model (and its data) here and reuse it on later runs",
    )  # fmt: skip
    parser.add_argument("--concurrency-only", action="store_true", help="skip the latency figures")
    parser.add_argument(
        "--no-malloc-tuning", action="store_true",
        help="glibc malloc defaults in the server and the peer (by default both raise the mmap "
        "and trim thresholds to 1 GiB, as tierserve serve does)",
    )  # fmt: skip
    parser.add_argument(
        "--baseline", default=None, metavar="GIT_REF",
        help="run the concurrency load against this checkout's server and the one of GIT_REF "
        "(both batched, alternating turns) instead of batched against unbatched",
    )  # fmt: skip
    parser.add_argument(
        "--server-args", default="", metavar="ARGS",
        help="extra arguments for this checkout's server (not the baseline's), e.g. "
        "'--workers 2'",
    )  # fmt: skip
    add_load_arguments(parser)
    parser.add_argument(
        "--compare-args", default="", metavar="ARGS",
        help="run the concurrency load against this checkout's batched server with "
        "--server-args and with these arguments (alternating turns), e.g. --server-args "
        "'--workers 2' --compare-args '--workers 1'",
    )  # fmt: skip
    parser.add_argument(
        "--volatile", choices=["hash_map", "multi_process_hash_map", "redis_cluster"],
        default="hash_map",
        help="volatile tier; redis_cluster starts a three-node cluster on loopback with the "
        "test suite's helpers (tests/services); multi_process_hash_map shares one copy of the "
        "table between worker processes (/dev/shm)",
    )  # fmt: skip
    return parser.parse_args(argv)


def main() -> int:
    args = parse_args()
    use_load_arguments(args)
    blas_threads = match_server_blas_threads(args.server_args)
    with tempfile.TemporaryDirectory() as tmp:
        work, out = _trained(args, Path(tmp))
        cluster, volatile = _volatile_tier(args, Path(tmp))
        try:
            repo = Path(tmp) / "repo"
            version = make_repository(out, args.iterations, repo, volatile)
            data = batches_from(version, work / "data")
            results: dict = {
                "cpu_count": os.cpu_count(),
                "volatile": args.volatile,
                "load_average_start": os.getloadavg()[0],
                "loadgen": clients.LOADGEN,
                "grpc_channels": clients.GRPC_CHANNELS,
                "blas_threads": blas_threads,
            }
            other = _measure(args, Path(tmp), repo, version, volatile, data, results)
        finally:
            if cluster is not None:
                cluster.stop()

    results["load_average_end"] = os.getloadavg()[0]
    report(results, args, other)
    if args.json:
        Path(args.json).write_text(
            json.dumps({str(k): v for k, v in results.items()}, indent=2, default=str)
        )
    return 0


def _trained(args: argparse.Namespace, tmp: Path) -> tuple[Path, Path]:
    """The work folder (``--train-dir`` or ``tmp``) and the trained model's output folder,
    trained unless it is there already."""
    work = tmp
    if args.train_dir:
        work = Path(args.train_dir)
        work.mkdir(parents=True, exist_ok=True)
    out = work / "out"
    if not (out / f"dlrm_dense_{args.iterations}.model").exists():
        print("training the trainer's DLRM ...", flush=True)
        out = train(work, args.iterations)
    return work, out


def _volatile_tier(args: argparse.Namespace, tmp: Path) -> tuple[object, dict | None]:
    """The running Redis Cluster (``--volatile redis_cluster``; None otherwise) and the
    ``volatile_db`` of the repository (None: the hash map)."""
    if args.volatile == "redis_cluster":
        cluster = start_redis_cluster(tmp)
        return cluster, {"type": "redis_cluster", "address": cluster.addresses}
    if args.volatile == "multi_process_hash_map":
        return None, {
            "type": args.volatile,
            "shared_memory_name": f"tierserve-bench-{os.getpid()}",
        }
    return None, None


def _measure(
    args: argparse.Namespace,
    tmp: Path,
    repo: Path,
    version: Path,
    volatile: dict | None,
    data: dict,
    results: dict,
) -> str:
    """Start the server, check it against predict, run the latency paths and the concurrency
    runs against the second server; the figures go into ``results``.  Returns what the
    second server is (``unbatched``, ``baseline`` or ``compared``)."""
    from tierserve.server.app import free_port

    scale = 0.3 if args.quick else 1.0
    repeats = {1: int(1000 * scale), 64: int(400 * scale), 1024: int(100 * scale)}
    extra: tuple[str, ...] = ()
    if args.no_malloc_tuning:
        extra = ("--no-malloc-tuning",)
    else:  # the peer gets the allocator settings the server gives itself
        from tierserve.server.runtime.allocator import tune_malloc

        results["malloc_tuning"] = tune_malloc()
    model, predict = predictor(version, volatile)
    http, grpc = free_port(), free_port()
    proc = start_server(repo, http, grpc, batching=True, extra=extra + _with_workers(args.server_args))
    try:
        paths = _checked_paths(predict, http, grpc, data)
        if not args.concurrency_only:
            results.update(interleaved(paths, data, repeats))
        other = _concurrency(args, tmp, repo, extra, data, results, (proc, http, grpc))
        results["floors"] = floor_runs(args.seconds / 2)
        results["predict_ms_per_row_at_64"] = model_share(predict, data[64])
    finally:
        proc.terminate()
        proc.wait()
        model.close()
    return other


def _checked_paths(predict, http: int, grpc: int, data: dict) -> dict:
    """The latency paths (predict, tritonclient and prebuilt requests over HTTP and gRPC),
    each checked to answer as predict does."""
    check = client_call("grpc", f"127.0.0.1:{grpc}")(*data[64])
    assert np.abs(check - predict(*data[64])).max() <= 1e-5, "server != predict"
    paths = {
        "predict": predict,
        "http": client_call("http", f"127.0.0.1:{http}"),
        "grpc": client_call("grpc", f"127.0.0.1:{grpc}"),
        "http-raw": prebuilt_call("http", f"127.0.0.1:{http}"),
        "grpc-raw": prebuilt_call("grpc", f"127.0.0.1:{grpc}"),
    }
    for name in ("http-raw", "grpc-raw"):
        got = paths[name](*data[64]).reshape(-1)
        assert np.abs(got - predict(*data[64]).reshape(-1)).max() <= 1e-5, name
    return paths


def _concurrency(
    args: argparse.Namespace,
    tmp: Path,
    repo: Path,
    extra: tuple[str, ...],
    data: dict,
    results: dict,
    batched: tuple,
) -> str:
    """The 64-client runs against ``batched`` (``(proc, http, grpc)``) and a second server:
    unbatched, ``--baseline``'s or with ``--compare-args``; returns which."""
    from tierserve.server.app import free_port

    proc, http, grpc = batched
    u_http, u_grpc = free_port(), free_port()
    other = "baseline" if args.baseline else "unbatched"
    env, others = None, _with_workers("")
    if args.baseline:
        env, others = snapshot(args.baseline, tmp / "baseline"), ()
    elif args.compare_args:
        other, others = "compared", _with_workers(args.compare_args)
    unbatched = start_server(repo, u_http, u_grpc, batching=other != "unbatched",
                             extra=extra + others, env=env)  # fmt: skip
    try:
        before, other_before = executions(http), executions(u_http)
        both = concurrency_runs(
            {"batched": (proc, http, grpc), other: (unbatched, u_http, u_grpc)},
            data, args.seconds, args.turns,
        )  # fmt: skip
        after, other_after = executions(http), executions(u_http)
    finally:
        unbatched.terminate()
        unbatched.wait()
    results["concurrent_batched"] = both["batched"]
    results[f"concurrent_{other}"] = both[other]
    results["executions"] = {k: after[k] - before[k] for k in after}
    results[f"executions_{other}"] = {k: other_after[k] - other_before[k] for k in after}
    return other


if __name__ == "__main__":
    sys.exit(main())
