"""The server processes of ``bench.server.run``: ``tierserve serve`` started in a
subprocess (this checkout's, or a git ref's snapshot), the BLAS threads the peer matches to
it, the CPU its processes and the whole machine use (``/proc``), and the requests and model
executions it counted (its ``/metrics``)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.server.model import ROOT


def snapshot(ref: str, where: Path) -> dict[str, str]:
    """The environment that runs ``tierserve`` as of git ``ref``: its files exported under
    ``where`` and a ``PYTHONPATH`` folder mapping ``tierserve.<pkg>`` onto them (ahead of the
    editable install's finder, which only answers what ``sys.path`` does not)."""
    src, path = where / "src", where / "path" / "tierserve"
    src.mkdir(parents=True)
    path.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    for pkg in ("server", "ps", "cache", "trainer", "clients"):
        (path / pkg).symlink_to(src / pkg)
    if not (src / "cache" / "cuda").exists():
        (src / "cache" / "cuda").symlink_to(src / "cuda")
    return {"PYTHONPATH": str(path.parent)}


def start_server(
    repo: Path,
    http: int,
    grpc: int,
    batching: bool,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> subprocess.Popen:
    """``tierserve serve`` in a subprocess, once it answers (``env``: added to this one's)."""
    import tritonclient.http as th

    args = [sys.executable, "-m", "tierserve.clients.cli", "serve", "--model-repository",
            str(repo), "--http-port", str(http), "--grpc-port", str(grpc), "--poll-interval", "0",
            "--log-level", "warning"]  # fmt: skip
    if not batching:
        args.append("--no-dynamic-batching")
    args.extend(extra)
    if env is None and "--workers" not in extra:  # this checkout: one process, as before
        args.extend(["--workers", "1"])
    proc = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})}, cwd="/" if env else None,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if th.InferenceServerClient(f"127.0.0.1:{http}").is_server_ready():
                return proc
        except Exception:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not start")


def _with_workers(args: str) -> tuple[str, ...]:
    """``args`` split, with ``--workers 1`` unless they name a worker count (a server of this
    checkout would start one worker per core)."""
    split = tuple(args.split())
    return split if "--workers" in split else (*split, "--workers", "1")


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo.extend(int(c) for c in task.read_text().split())
    return out


def cpu_by_process(proc: subprocess.Popen) -> dict[int, float]:
    """CPU seconds (user + system) used so far by the server process (with its waited-for
    children) and by each of its live descendants (worker processes), by pid."""
    found = {}
    for pid in _descendants(proc.pid):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks = sum(int(f) for f in fields[11:15]) if pid == proc.pid else (
            int(fields[11]) + int(fields[12])
        )  # fmt: skip
        found[pid] = ticks / os.sysconf("SC_CLK_TCK")
    return found


def server_cpu(proc: subprocess.Popen) -> float:
    """CPU seconds (user + system) the server process and its worker processes have used so
    far (what exited workers used is counted once they were waited for)."""
    return sum(cpu_by_process(proc).values())


#: Other jobs' cores under which a turn counts as quiet (the machine is shared).
QUIET_CORES = 0.25


def machine_busy() -> float:
    """CPU seconds the whole machine has been busy (all cores, /proc/stat: not idle or
    waiting on I/O)."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def executions(http: int) -> dict:
    """Requests and model executions the server counted (its /metrics)."""
    import urllib.request

    found = {"requests": 0, "executions": 0}
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{http}/metrics", timeout=10).read()
    except OSError:  # a baseline without /metrics
        return found
    text = text.decode()
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name == "tierserve_batch_requests_sum":
            found["requests"] += int(float(line.rsplit(" ", 1)[1]))
        elif name == "tierserve_batch_requests_count":
            found["executions"] += int(float(line.rsplit(" ", 1)[1]))
    return found


def match_server_blas_threads(server_args: str) -> int:
    """Give this process's BLAS the thread count the server's model runs with (what
    ``server_args`` gives ``--blas-threads``, read by ``tierserve serve``'s own parser, else
    1: its default), so that ``predict`` and the server compute alike; returns it."""
    from tierserve.clients.cli import build_parser
    from tierserve.model.blas_threads import set_blas_threads

    serve = ["serve", "--model-repository", ".", *server_args.split()]
    threads = build_parser().parse_known_args(serve)[0].blas_threads or 1
    set_blas_threads(threads)
    return threads
