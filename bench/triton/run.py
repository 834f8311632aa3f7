"""tierserve's own server beside tritonserver serving the same DLRM through ``tierserve
triton-repo`` (Python backend, dynamic batching on), with InferenceModel.predict as the floor.

    python -m bench.triton.run                     # the server benchmark's DLRM
    python -m bench.triton.run --quick --train-dir /tmp/bench-dlrm   # fewer requests, reuse it

Same model, same machine, same run, same load generator as ``bench.server.run`` (whose
functions it uses): the trainer issue's DLRM (26 tables x dim 16, ~1M keys, hash map tier).

1. One client, batch 1, 64 and 1024: ``predict`` (InferenceModel.predict_batch in this
   process), tierserve serve over HTTP and gRPC, tritonserver over HTTP and gRPC
   (tritonclient, binary tensors), in interleaved turns so machine noise falls on every path
   alike: rows/s, p50, p99.  Triton's overhead = its p50 at batch 1 minus predict's.
2. 64 concurrent batch-1 clients (bench.server.run's load generator, :mod:`bench.server.loadgen`:
   wrk and h2load by default, ``--loadgen python`` for asyncio; the same request bytes for
   both servers), servers in alternating turns: rows/s, the server's CPU per request
   (tritonserver counted with its Python backend stub processes) and the generator's.

tritonserver comes from the test setup (tests/services/triton.py: the ``nvidia-pytriton`` wheel,
installed on first use under ~/.cache/tierserve).  Prints a table; ``--json FILE`` writes it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

# One BLAS thread per inference thread, as in bench.server.run (set before numpy loads).
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402

from bench.server import run as server_bench  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PATHS = ("predict", "tierserve_http", "tierserve_grpc", "triton_http", "triton_grpc")


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` and its live descendants
    (tritonserver runs each model instance in a Python backend stub process)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        total += times.get(p, 0.0)
        todo += [c for c, parent in parents.items() if parent == p]
    return total


def prepare_dlrm(train_dir: str | None, iterations: int, tmp: Path):
    """The trainer's DLRM in a model repository under ``tmp``: ``(repo, version folder,
    test batches)``; trained into ``train_dir`` (``tmp`` when None) unless it is there."""
    work = Path(train_dir) if train_dir else tmp
    work.mkdir(parents=True, exist_ok=True)
    out = work / "out"
    if not (out / f"dlrm_dense_{iterations}.model").exists():
        print("training the trainer's DLRM ...", flush=True)
        out = server_bench.train(work, iterations)
    repo = tmp / "repo"
    version = server_bench.make_repository(out, iterations, repo)
    return repo, version, server_bench.batches_from(version, work / "data")


def start_triton(repo: Path, work: Path):
    """tritonserver (test setup's install) over the Triton repository generated for ``repo``."""
    sys.path.insert(0, str(ROOT / "tests"))
    from services.triton import TritonServer, ensure_tritonserver

    from tierserve.clients.triton_repo import generate

    generate(repo, work / "triton")
    server = TritonServer(ensure_tritonserver(), work / "triton", work / "tritonserver.log")
    server.start(timeout=600)
    return server


def concurrency(servers: dict, data: dict, seconds: float, turns: int) -> dict:
    """``name: (pid, http, grpc)`` -> per protocol: rows/s (median turn), server and load
    generator CPU ms per request, and the cores other jobs took in each turn, the servers
    taking turns of ``seconds / turns``."""
    runs: dict = {(n, p): [] for n in servers for p in ("grpc", "http")}
    for _ in range(turns):
        for protocol in ("grpc", "http"):
            for name, (pid, http, grpc) in servers.items():
                port = grpc if protocol == "grpc" else http
                before, machine = tree_cpu(pid), server_bench.machine_busy()
                started, own = time.perf_counter(), time.process_time()
                result = server_bench.concurrent_load(
                    protocol, f"127.0.0.1:{port}", data, 64, seconds / turns
                )
                used = tree_cpu(pid) - before
                native = result.cpu_s if result.generator != "python" else 0.0
                foreign = (
                    server_bench.machine_busy() - machine - used - native
                    - (time.process_time() - own)
                ) / (time.perf_counter() - started)  # fmt: skip
                runs[(name, protocol)].append(
                    (result.rate, used / result.requests, result.cpu_per_request, foreign)
                )
    return {
        f"{name}_{protocol}": {
            "rows_s": statistics.median(t[0] for t in done),
            "rows_s_turns": [t[0] for t in done],
            "server_cpu_ms_per_request": statistics.median(t[1] for t in done) * 1e3,
            "client_cpu_ms_per_request": statistics.median(t[2] for t in done) * 1e3,
            "foreign_cores_turns": [t[3] for t in done],
        }
        for (name, protocol), done in runs.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--iterations", type=int, default=50, help="training iterations")
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="concurrency test length per server and protocol")  # fmt: skip
    parser.add_argument("--train-dir", default=None,
                        help="keep the trained model here and reuse it on later runs")  # fmt: skip
    parser.add_argument(
        "--server-args", default="--workers 1", metavar="ARGS",
        help="arguments for tierserve serve (default '--workers 1'; on 2 cores '--workers 2' is "
        "the setting to hold against tritonserver, which uses every core)",
    )  # fmt: skip
    server_bench.add_load_arguments(parser)
    args = parser.parse_args()
    generator = server_bench.use_load_arguments(args)
    scale = 0.3 if args.quick else 1.0
    repeats = {1: int(1000 * scale), 64: int(400 * scale), 1024: int(100 * scale)}
    from tierserve.server.app import free_port
    from tierserve.server.runtime.allocator import tune_malloc

    results: dict = {
        "cpu_count": os.cpu_count(),
        "load_average_start": os.getloadavg()[0],
        "loadgen": generator,
    }
    with tempfile.TemporaryDirectory() as tmp:
        repo, version, data = prepare_dlrm(args.train_dir, args.iterations, Path(tmp))
        results["malloc_tuning"] = tune_malloc()  # the peer's allocator as tierserve serve's
        model, predict = server_bench.predictor(version)
        http, grpc = free_port(), free_port()
        results["server_args"] = args.server_args
        proc = server_bench.start_server(
            repo, http, grpc, batching=True, extra=server_bench._with_workers(args.server_args)
        )
        triton = None
        try:
            triton = start_triton(repo, Path(tmp))
            calls = {
                "predict": predict,
                "tierserve_http": server_bench.client_call("http", f"127.0.0.1:{http}"),
                "tierserve_grpc": server_bench.client_call("grpc", f"127.0.0.1:{grpc}"),
                "triton_http": server_bench.client_call("http", triton.http_url),
                "triton_grpc": server_bench.client_call("grpc", triton.grpc_url),
            }
            for b in (1, 64, 1024):
                expected = predict(*data[b])
                for name, call in calls.items():
                    got = call(*data[b])
                    assert np.abs(got - expected).max() <= 1e-5, f"{name} != predict at batch {b}"
            results.update(server_bench.interleaved(calls, data, repeats))
            results["concurrent"] = concurrency(
                {"tierserve": (proc.pid, http, grpc),
                 "triton": (triton.process.popen.pid, triton.http_port, triton.grpc_port)},
                data, args.seconds, turns=4,
            )  # fmt: skip
        finally:
            if triton is not None:
                triton.stop()
            proc.terminate()
            proc.wait()
            model.close()
    results["load_average_end"] = os.getloadavg()[0]
    report(results)
    if args.json:
        Path(args.json).write_text(json.dumps({str(k): v for k, v in results.items()}, indent=2))
    return 0


def report(results: dict) -> None:
    print(
        f"\nCPU cores: {results['cpu_count']}, tierserve serve {results['server_args']}, load "
        f"generator {results['loadgen']}, load average "
        f"{results['load_average_start']:.1f} at the start, {results['load_average_end']:.1f} at "
        "the end"
    )
    print(f"{'path':<16}{'batch':>6}{'rows/s':>12}{'p50 ms':>9}{'p99 ms':>9}{'vs predict':>11}")
    for path in PATHS:
        for b in (1, 64, 1024):
            r, base = results[path][b], results["predict"][b]["p50_ms"]
            extra = "" if path == "predict" else f"{r['p50_ms'] - base:+.3f} ms"
            print(f"{path:<16}{b:>6}{r['rows_per_s']:>12,.0f}{r['p50_ms']:>9.3f}"
                  f"{r['p99_ms']:>9.3f}{extra:>11}")  # fmt: skip
    overhead = results["triton_http"][1]["p50_ms"] - results["predict"][1]["p50_ms"]
    overhead_grpc = results["triton_grpc"][1]["p50_ms"] - results["predict"][1]["p50_ms"]
    results["triton_overhead_ms"] = {"http": overhead, "grpc": overhead_grpc}
    print(f"Triton's overhead at batch 1 (its p50 minus predict's): HTTP {overhead:.3f} ms, "
          f"gRPC {overhead_grpc:.3f} ms")  # fmt: skip
    for b in (1, 64, 1024):
        for protocol in ("http", "grpc"):
            ts, tr = results[f"tierserve_{protocol}"][b], results[f"triton_{protocol}"][b]
            print(f"batch {b:>4} {protocol}: p50 tierserve {ts['p50_ms']:.3f} ms, Triton "
                  f"{tr['p50_ms']:.3f} ms: tierserve {tr['p50_ms'] / ts['p50_ms']:.2f}x as fast")  # fmt: skip
    c = results["concurrent"]
    for protocol in ("grpc", "http"):
        ts, tr = c[f"tierserve_{protocol}"], c[f"triton_{protocol}"]
        print(
            f"64 concurrent batch-1 {protocol} clients: tierserve {ts['rows_s']:,.0f} rows/s, "
            f"Triton {tr['rows_s']:,.0f} (tierserve {ts['rows_s'] / tr['rows_s']:.2f}x); server CPU ms per "
            f"request {ts['server_cpu_ms_per_request']:.3f} vs {tr['server_cpu_ms_per_request']:.3f}"
            f"; load generator {ts['client_cpu_ms_per_request']:.3f} / "
            f"{tr['client_cpu_ms_per_request']:.3f} ms per request; other jobs' cores "
            f"{max(ts['foreign_cores_turns'] + tr['foreign_cores_turns']):.2f} at most; turns {', '.join(f'{a:,.0f}/{b:,.0f}' for a, b in zip(ts['rows_s_turns'], tr['rows_s_turns']))}"
        )


if __name__ == "__main__":
    sys.exit(main())
