"""What ``bench.server.run`` prints (and adds to its results): the latency table, the
concurrency figures (batched against unbatched, or against ``--baseline`` /
``--compare-args``), the do-nothing floors, and the batch sizes the servers ran."""

from __future__ import annotations

import argparse
import statistics

from bench.server.model import BATCHES
from bench.server.process import QUIET_CORES

PATHS = ("predict", "http", "grpc", "http-raw", "grpc-raw")


def report(results: dict, args: argparse.Namespace, other: str) -> None:
    """Print the figures of one run; ``other``: the second server of the concurrency runs
    (``unbatched``, ``baseline`` or ``compared``).  Ratios are added to ``results``."""
    _header(results, args)
    if not args.concurrency_only:
        _latency(results)
    if args.baseline or args.compare_args:
        for protocol in ("grpc", "http"):
            _comparison(results, args, protocol)
    if other == "unbatched":
        for protocol in ("grpc", "http"):
            _batching(results, protocol)
        for protocol in ("grpc", "http"):
            _ceiling(results, protocol)
    for protocol in ("grpc", "http"):
        _of_floor(results, protocol)
    _executions(results, other)


def _header(results: dict, args: argparse.Namespace) -> None:
    print(
        f"\nCPU cores: {results['cpu_count']}, BLAS threads (predict and server): "
        f"{results['blas_threads']}, volatile tier: {args.volatile}, malloc tuning: "
        f"{'off' if args.no_malloc_tuning else 'on'} (server and peer), load generator "
        f"{results['loadgen']}, load average "
        f"{results['load_average_start']:.1f} at the start, {results['load_average_end']:.1f} "
        "at the end (other jobs on the machine slow the paths unevenly)"
    )


def _latency(results: dict) -> None:
    print(f"{'path':<10}{'batch':>6}{'rows/s':>12}{'p50 ms':>9}{'p99 ms':>9}{'overhead':>10}"
          f"{'>3x p50':>9}")  # fmt: skip
    for path in PATHS:
        for b in BATCHES:
            r = results[path][b]
            base = results["predict"][b]["p50_ms"]
            over = "" if path == "predict" else f"{(r['p50_ms'] - base) / base:>9.0%}"
            print(f"{path:<10}{b:>6}{r['rows_per_s']:>12,.0f}{r['p50_ms']:>9.3f}"
                  f"{r['p99_ms']:>9.3f}{over:>10}{r['over_3x_p50']:>9.1%}")  # fmt: skip


def _comparison(results: dict, args: argparse.Namespace, protocol: str) -> None:
    """This checkout's batched server against ``--baseline`` or ``--compare-args``."""
    other = "baseline" if args.baseline else "compared"
    against = args.baseline or args.compare_args
    new = results["concurrent_batched"][protocol]
    old = results[f"concurrent_{other}"][protocol]
    ratio = new["rows_s"] / old["rows_s"]
    results[f"speedup_over_{other}_{protocol}"] = ratio
    turns = ", ".join(
        f"{a:,.0f}/{b:,.0f}" for a, b in zip(new["rows_s_turns"], old["rows_s_turns"])
    )
    quiet = [
        a / b
        for a, b, fa, fb in zip(
            new["rows_s_turns"], old["rows_s_turns"],
            new["foreign_cores_turns"], old["foreign_cores_turns"],
        )
        if max(fa, fb) < QUIET_CORES
    ]  # fmt: skip
    results[f"speedup_over_{other}_{protocol}_quiet_turns"] = quiet
    print(
        f"64 concurrent batch-1 {protocol} clients, batched: {new['rows_s']:,.0f} rows/s "
        f"here{' (' + args.server_args + ')' if args.server_args else ''}, "
        f"{old['rows_s']:,.0f} with {against} ({ratio:.2f}x; turns {turns}); "
        f"server CPU ms per request {new['server_cpu_ms_per_request']:.3f} here, "
        f"{old['server_cpu_ms_per_request']:.3f} with {against}; load generator "
        f"{new['client_cpu_ms_per_request']:.3f} / {old['client_cpu_ms_per_request']:.3f}"
    )
    for label, r in (("here", new), (against, old)):
        print(f"  cores by server process, {label} (parent first): " + ", ".join(
            f"{k} {v:.2f}" for k, v in r["cores_by_process"].items())
            + "; other jobs' cores per turn: " + ", ".join(
            f"{v:.2f}" for v in r["foreign_cores_turns"]))  # fmt: skip
    print(
        f"  turn pairs where other jobs took under {QUIET_CORES} cores: {len(quiet)} of "
        f"{len(new['rows_s_turns'])}"
        + (f", ratio median {statistics.median(quiet):.2f}x (each: "
           + ", ".join(f"{q:.2f}" for q in quiet) + ")" if quiet else "")
    )  # fmt: skip


def _batching(results: dict, protocol: str) -> None:
    """Dynamic batching on against off."""
    on = results["concurrent_batched"][protocol]
    off = results["concurrent_unbatched"][protocol]
    ratio = on["rows_s"] / off["rows_s"]
    results[f"batching_speedup_{protocol}"] = ratio
    turns = ", ".join(
        f"{a:,.0f}/{b:,.0f}" for a, b in zip(on["rows_s_turns"], off["rows_s_turns"])
    )
    print(
        f"64 concurrent batch-1 {protocol} clients: {on['rows_s']:,.0f} rows/s batched, "
        f"{off['rows_s']:,.0f} unbatched ({ratio:.1f}x; turns {turns}); CPU ms per request, server / "
        f"load generator: batched {on['server_cpu_ms_per_request']:.3f} / "
        f"{on['client_cpu_ms_per_request']:.3f}, unbatched "
        f"{off['server_cpu_ms_per_request']:.3f} / {off['client_cpu_ms_per_request']:.3f}"
    )


def _ceiling(results: dict, protocol: str) -> None:
    """What batching can gain at most: the unbatched server's CPU per request over the
    floor's plus predict's time per row."""
    share = results["predict_ms_per_row_at_64"]
    floor = results["floors"][protocol]["server_cpu_ms_per_request"]
    off = results["concurrent_unbatched"][protocol]["server_cpu_ms_per_request"]
    ceiling = off / (floor + share)
    results[f"batching_ceiling_{protocol}"] = ceiling
    print(
        f"{protocol} floor, a server that answers without any work: "
        f"{results['floors'][protocol]['rows_s']:,.0f} requests/s at {floor:.3f} ms server "
        f"CPU per request; with predict's {share:.3f} ms per row at batch 64, the unbatched "
        f"server's {off:.3f} ms bounds what batching can gain: {ceiling:.1f}x"
    )


def _of_floor(results: dict, protocol: str) -> None:
    floor = results["floors"][protocol]
    on = results["concurrent_batched"][protocol]["rows_s"]
    results[f"of_floor_{protocol}"] = on / floor["rows_s"]
    print(
        f"{protocol}: the batched server's {on:,.0f} rows/s is {on / floor['rows_s']:.2f}x the "
        f"do-nothing server's {floor['rows_s']:,.0f} requests/s "
        f"({floor['server_cpu_ms_per_request']:.3f} ms server CPU per request, load "
        f"generator {floor['client_cpu_ms_per_request']:.3f} ms)"
    )


def _executions(results: dict, other: str) -> None:
    for label, key in (("batched server", "executions"), (other, f"executions_{other}")):
        ex = results[key]
        if ex["executions"]:
            print(
                f"{label}, concurrency runs: {ex['requests']:,} requests in "
                f"{ex['executions']:,} executions ({ex['requests'] / ex['executions']:.1f} per "
                "execution)"
            )
