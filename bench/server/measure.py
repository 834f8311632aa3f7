"""The throughput runs of ``bench.server.run``: 64 concurrent batch-1 clients against two
servers in alternating turns (rows/s, client and server CPU per request, cores per server
process, other jobs' cores), the same load against the do-nothing servers of
:mod:`bench.server.floors`, and the model's own time per row."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time

import numpy as np

from bench.server.clients import concurrent_load
from bench.server.model import ROOT, SLOTS
from bench.server.process import cpu_by_process, machine_busy, server_cpu


def concurrency_runs(servers: dict, data: dict, seconds: float, turns: int = 4) -> dict:
    """Both protocols' concurrent throughput on each server (``name: (proc, http, grpc)``),
    with client and server CPU per request, the cores each server process used (the parent
    first: how evenly the kernel spread the load over worker processes) and the cores that
    other processes took meanwhile (``foreign_cores``: other jobs on the machine, which
    make a turn slower than the server can go).  The servers
    take ``turns`` turns of ``seconds / turns`` each, so other jobs' bursts fall on batched
    and unbatched alike; the figure is the median turn."""
    runs: dict = {(name, p): [] for name in servers for p in ("grpc", "http")}
    cores: dict = {(name, p): {} for name in servers for p in ("grpc", "http")}
    busy: dict = dict.fromkeys(runs, 0.0)
    for _ in range(turns):
        for protocol in ("grpc", "http"):
            for name, (proc, http, grpc) in servers.items():
                port = grpc if protocol == "grpc" else http
                before = cpu_by_process(proc)
                started, machine, own = time.perf_counter(), machine_busy(), time.process_time()
                result = concurrent_load(
                    protocol, f"127.0.0.1:{port}", data, 64, seconds / turns)  # fmt: skip
                elapsed = time.perf_counter() - started
                busy[(name, protocol)] += elapsed
                after = cpu_by_process(proc)
                used = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
                # the python generator's CPU is this process's own
                native = result.cpu_s if result.generator != "python" else 0.0
                foreign = (
                    machine_busy() - machine - sum(used.values()) - native
                    - (time.process_time() - own)
                ) / elapsed  # fmt: skip
                server = sum(used.values()) / max(result.requests, 1)
                for pid, cpu in used.items():
                    key = "parent" if pid == proc.pid else pid
                    cores[(name, protocol)][key] = cores[(name, protocol)].get(key, 0.0) + cpu
                runs[(name, protocol)].append(
                    (result.rate, result.cpu_per_request, server, foreign)
                )
    out: dict = {name: {} for name in servers}
    for (name, protocol), turns_done in runs.items():
        out[name][protocol] = {
            "rows_s": statistics.median(t[0] for t in turns_done),
            "rows_s_turns": [t[0] for t in turns_done],
            "client_cpu_ms_per_request": statistics.median(t[1] for t in turns_done) * 1e3,
            "server_cpu_ms_per_request": statistics.median(t[2] for t in turns_done) * 1e3,
            "foreign_cores_turns": [t[3] for t in turns_done],
            "cores_by_process": {
                str(k): v / busy[(name, protocol)] for k, v in cores[(name, protocol)].items()
            },
        }
    return out


def floor_runs(seconds: float) -> dict:
    """Server CPU per request of the do-nothing servers of :mod:`bench.server.floors` under the
    same load as the real ones (64 batch-1 clients, same request bytes)."""
    import socket

    import grpc as grpc_mod

    from tierserve.server.app import free_port

    des = np.zeros((1, 13), np.float32)
    cat = np.zeros((1, SLOTS), np.int64)
    out = {}
    for protocol in ("grpc", "http"):
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "bench.server.floors", protocol, str(port)], cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if protocol == "http":
                        socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    else:
                        with grpc_mod.insecure_channel(f"127.0.0.1:{port}") as channel:
                            grpc_mod.channel_ready_future(channel).result(timeout=1)
                    break
                except (OSError, grpc_mod.FutureTimeoutError):
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError(f"the {protocol} floor server did not start") from None
                    time.sleep(0.2)
            before = server_cpu(proc)
            result = concurrent_load(protocol, f"127.0.0.1:{port}", {1: (des, cat)}, 64, seconds)
            out[protocol] = {
                "rows_s": result.rate,
                "server_cpu_ms_per_request": (server_cpu(proc) - before) / result.requests * 1e3,
                "client_cpu_ms_per_request": result.cpu_per_request * 1e3,
            }
        finally:
            proc.terminate()
            proc.wait()
    return out


def model_share(predict, batch, calls: int = 20) -> float:
    """Milliseconds of ``predict`` per row of ``batch`` (the fastest of ``calls``)."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        predict(*batch)
        times.append(time.perf_counter() - t0)
    return min(times) / batch[0].shape[0] * 1e3
