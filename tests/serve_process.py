"""``tierserve serve`` as a real process, for tests that restart, kill or run several servers."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

from tierserve.clients.demo_model import write_repository


def demo_repository(demo, folder: Path, name: str, volatile: dict, update_source: dict | None,
                    **model_fields) -> tuple[str, int]:  # fmt: skip
    """The demo model as model ``name`` (so its Kafka topic is the caller's alone) in a
    repository at ``folder`` with ``volatile`` as its volatile tier, no persistent tier, and
    ``update_source``; ``model_fields`` override the model's ps.json entry.  Returns the
    table name and its dim."""
    write_repository(demo, folder)
    shutil.move(folder / "dlrm", folder / name)
    config = json.loads((folder / "ps.json").read_text())
    entry = config["models"][0]
    entry["model"] = name
    for field in ("dense_file", "network_file"):
        entry[field] = entry[field].replace("dlrm/", f"{name}/", 1)
    entry["sparse_files"] = [f.replace("dlrm/", f"{name}/", 1) for f in entry["sparse_files"]]
    entry.update(model_fields)
    config["volatile_db"] = volatile
    config["persistent_db"] = {"type": "disabled"}
    if update_source is not None:
        config["update_source"] = update_source
    (folder / "ps.json").write_text(json.dumps(config))
    return entry["embedding_table_names"][0], entry["embedding_vecsize_per_table"][0]


def serve(repo: Path, port: int, env: dict, *args: str) -> subprocess.Popen:
    """``tierserve serve`` of ``repo`` on HTTP ``port`` (no gRPC, no polling, one process);
    its log level is ``$TIERSERVE_TEST_SERVE_LOG`` (default warning), its output on
    ``proc.stdout``."""
    return subprocess.Popen(
        [sys.executable, "-m", "tierserve.clients.cli", "serve", "--model-repository", str(repo),
         "--http-port", str(port), "--no-grpc", "--poll-interval", "0", "--log-level", os.environ.get("TIERSERVE_TEST_SERVE_LOG", "warning"),
         "--workers", "1", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def ready_status(url: str) -> int | None:
    """``/v2/health/ready``'s status code, None while nothing answers."""
    try:
        return httpx.get(f"{url}/v2/health/ready", timeout=5).status_code
    except httpx.TransportError:
        return None


def wait_ready(proc: subprocess.Popen, url: str, timeout: float = 90.0,
               interval: float = 0.2) -> float:  # fmt: skip
    """Wait until ``url`` says ready; returns the seconds waited.  Fails with the process's
    output when it exits first or ``timeout`` passes."""
    started = time.monotonic()
    while ready_status(url) != 200:
        assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
        assert time.monotonic() - started < timeout, f"{url} not ready after {timeout} s"
        time.sleep(interval)
    return time.monotonic() - started


def stop(*procs: subprocess.Popen) -> None:
    """SIGTERM each process, then SIGKILL what has not exited 30 s later."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with contextlib.suppress(Exception):
            proc.stdout.close()


def infer_body(des: np.ndarray, cat: np.ndarray) -> dict:
    """A KServe v2 JSON request of the demo model's two inputs."""
    return {"inputs": [
        {"name": "DES", "datatype": "FP32", "shape": list(des.shape),
         "data": des.reshape(-1).tolist()},
        {"name": "CATCOLUMN", "datatype": "INT64", "shape": list(cat.shape),
         "data": cat.reshape(-1).tolist()},
    ]}  # fmt: skip


def predict(client: httpx.Client, url: str, name: str, body: dict) -> np.ndarray:
    """``OUTPUT0`` of model ``name`` for ``body`` (asserts a 200)."""
    r = client.post(f"{url}/v2/models/{name}/infer", json=body)
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["outputs"][0]["data"], np.float32)


def cpu_seconds(pid: int) -> float:
    """CPU time the threads of process ``pid`` and of its children have run so far, in
    seconds (Linux ``schedstat``, nanoseconds): what a request costs a server, without the
    time its threads waited for a core on a busy machine."""
    pids = [pid]
    with contextlib.suppress(OSError):
        pids += [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    total = 0
    for p in pids:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{p}/task").iterdir():
                with contextlib.suppress(OSError, IndexError, ValueError):
                    total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9
