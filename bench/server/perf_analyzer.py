"""Triton's ``perf_analyzer`` against tierserve serve and tritonserver serving the same DLRM.

    sh bench/server/perf_analyzer.sh                      # install, train, measure
    sh bench/server/perf_analyzer.sh --train-dir /tmp/bench-dlrm --measurement-interval 4000

- Model: ``bench.server.run``'s DLRM (26 tables x dim 16, ~1M keys, hash map tier) in one
  model repository.  tritonserver (the test setup's, tests/services/triton.py) serves the
  Triton repository ``tierserve triton-repo`` generates from it (Python backend, dynamic
  batching), tierserve serve the repository itself (``--server-args``, default
  ``--workers 1``): both started side by side, as ``bench.triton.run`` does, and measured
  in turn while the other idles.
- Data: one ``--input-data`` file of ``--rows`` real rows of the test split, batch-1
  requests sent in turn; the same file for both servers.
- Load: ``--concurrency-range 1:64:9`` (1, 10, ..., 64 requests in flight) over HTTP and
  gRPC, with each server's answers checked against the other's first.  Each level is one
  perf_analyzer run per server, the servers in turn (perf_analyzer's own sweep stops at the
  first level it cannot stabilise, and the machine's noise should fall on both alike); a
  level without a stable window is shown as such.  Prints, per protocol and concurrency,
  requests/s and client p50/p99 of both, and tierserve's throughput over tritonserver's.
  ``--json FILE`` writes the figures.

perf_analyzer is the one in tritonclient's wheel (``.venv/bin/perf_analyzer``); its two
missing libraries are installed as the tests install them (tests/services/perf_analyzer.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import numpy as np  # noqa: E402

from bench.server import run as server_bench  # noqa: E402
from bench.triton.run import prepare_dlrm, start_triton  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from services.perf_analyzer import (  # noqa: E402
    UnstableMeasurement,
    ensure_perf_analyzer,
    write_input_data,
)

SERVERS = ("tierserve", "triton")


def input_data(data: dict, rows: int, path: Path) -> Path:
    """``rows`` batch-1 requests (one row each, no batch dimension) of the test split."""
    des, cat = data[max(data)]
    if rows > des.shape[0]:
        raise SystemExit(f"--rows {rows}: the test batch holds {des.shape[0]} rows")
    requests = [{"DES": des[i].astype(np.float32), "CATCOLUMN": cat[i].astype(np.int64)}
                for i in range(rows)]  # fmt: skip
    return write_input_data(path, requests)


def check_same_answers(urls: dict, data: dict) -> None:
    """Both servers answer the first 64 rows alike over both protocols."""
    des, cat = data[64]
    answers = {(name, protocol): server_bench.client_call(protocol, url[protocol])(des, cat)
               for name, url in urls.items() for protocol in ("http", "grpc")}  # fmt: skip
    first = next(iter(answers.values()))
    for key, got in answers.items():
        if np.abs(got - first).max() > 1e-5:
            raise SystemExit(f"{key} answers differ from {next(iter(answers))}")


def concurrencies(text: str) -> list[int]:
    """``START:END:STEP`` (perf_analyzer's ``--concurrency-range``) as a list."""
    try:
        start, end, step = (list(map(int, text.split(":"))) + [1])[:3]
    except ValueError:
        raise SystemExit(f"--concurrency-range {text!r}: expected START:END[:STEP]") from None
    return list(range(start, end + 1, step))


def sweep(analyzer, args, urls: dict, protocol: str, data_file: Path) -> dict[str, list]:
    """Each concurrency with one perf_analyzer run per server, the servers in turn (so the
    machine's noise falls on both alike); a level perf_analyzer cannot stabilise is recorded
    as such and the sweep goes on."""
    results: dict[str, list] = {name: [] for name in SERVERS}
    for concurrency in concurrencies(args.concurrency_range):
        for name in SERVERS:
            argv = ["-m", "dlrm", "-u", urls[name][protocol], "-i", protocol,
                    "--input-data", str(data_file), "--concurrency-range", str(concurrency),
                    "--measurement-interval", str(args.measurement_interval),
                    "--stability-percentage", str(args.stability_percentage),
                    "--max-trials", str(args.max_trials)]  # fmt: skip
            try:
                row = analyzer.run(argv, timeout=900)[0].__dict__
            except UnstableMeasurement:
                row = {"concurrency": concurrency, "unstable": True}
            results[name].append(row)
            shown = (f"{row['throughput']:,.0f} req/s, p50 {row['p50_ms']:.2f} ms, p99 "
                     f"{row['p99_ms']:.2f} ms" if "throughput" in row else "no stable window")  # fmt: skip
            print(f"  {protocol} {name:<9} concurrency {concurrency:>3}: {shown}", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train-dir", default=None,
                        help="keep the trained model here and reuse it on later runs")  # fmt: skip
    parser.add_argument("--iterations", type=int, default=50, help="training iterations")
    parser.add_argument("--rows", type=int, default=512, help="requests in the data file")
    parser.add_argument("--concurrency-range", default="1:64:9", metavar="START:END:STEP")
    parser.add_argument("--measurement-interval", type=int, default=3000, metavar="MS",
                        help="perf_analyzer's window (default 3000 ms)")  # fmt: skip
    parser.add_argument("--stability-percentage", type=float, default=50.0,
                        help="perf_analyzer's (its default 10 rarely settles on a shared "
                        "machine; default 50)")  # fmt: skip
    parser.add_argument("--max-trials", type=int, default=10)
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--server-args", default="--workers 1", metavar="ARGS",
                        help="arguments for tierserve serve (default '--workers 1')")  # fmt: skip
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args()
    analyzer = ensure_perf_analyzer()
    results: dict = {"cpu_count": os.cpu_count(), "load_average_start": os.getloadavg(),
                     "server_args": args.server_args, "command": sys.argv[1:]}  # fmt: skip
    from tierserve.server.app import free_port

    with tempfile.TemporaryDirectory() as tmp:
        repo, _, data = prepare_dlrm(args.train_dir, args.iterations, Path(tmp))
        data_file = input_data(data, args.rows, Path(tmp) / "input-data.json")
        http, grpc = free_port(), free_port()
        proc = server_bench.start_server(
            repo, http, grpc, batching=True, extra=server_bench._with_workers(args.server_args)
        )
        triton = None
        try:
            triton = start_triton(repo, Path(tmp))
            urls = {"tierserve": {"http": f"127.0.0.1:{http}", "grpc": f"127.0.0.1:{grpc}"},
                    "triton": {"http": triton.http_url, "grpc": triton.grpc_url}}  # fmt: skip
            check_same_answers(urls, data)
            for protocol in args.protocols.split(","):
                for name, rows in sweep(analyzer, args, urls, protocol, data_file).items():
                    results[f"{name}_{protocol}"] = rows
        finally:
            if triton is not None:
                triton.stop()
            proc.terminate()
            proc.wait()
    results["load_average_end"] = os.getloadavg()
    report(results, args.protocols.split(","))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def report(results: dict, protocols: list[str]) -> None:
    start, end = results["load_average_start"], results["load_average_end"]
    print(f"\nCPU cores: {results['cpu_count']}, tierserve serve {results['server_args']}; "
          f"load average {start[0]:.1f} at the start, {end[0]:.1f} at the end")  # fmt: skip
    print(f"{'protocol':<9}{'conc':>5}{'tierserve req/s':>17}{'p50 ms':>8}{'p99 ms':>8}"
          f"{'triton req/s':>14}{'p50 ms':>8}{'p99 ms':>8}{'ratio':>7}")  # fmt: skip
    for protocol in protocols:
        ours = {r["concurrency"]: r for r in results[f"tierserve_{protocol}"]}
        theirs = {r["concurrency"]: r for r in results[f"triton_{protocol}"]}
        for c in sorted(set(ours) & set(theirs)):
            a, b = ours[c], theirs[c]
            if a.get("unstable") or b.get("unstable"):
                who = " and ".join(
                    n for n, r in (("tierserve", a), ("triton", b)) if r.get("unstable")
                )
                print(f"{protocol:<9}{c:>5}  no stable window for {who}")
                continue
            print(f"{protocol:<9}{c:>5}{a['throughput']:>17,.0f}{a['p50_ms']:>8.2f}"
                  f"{a['p99_ms']:>8.2f}{b['throughput']:>14,.0f}{b['p50_ms']:>8.2f}"
                  f"{b['p99_ms']:>8.2f}{a['throughput'] / b['throughput']:>6.2f}x")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
