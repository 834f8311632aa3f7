"""Memory a large allowed request used goes back to the OS afterwards, although ``tierserve
serve`` keeps freed memory in its heap for the usual batch sizes (server/runtime/allocator.py)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from polling import settled, until

from tierserve.server.app import free_port

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="malloc tuning and trimming are glibc's",
)


def _rss_mib(pid: int) -> float:
    """Resident anonymous memory (the heap; not the pages of shared libraries, which come in
    when first used and stay)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon")


class _PeakSampler(threading.Thread):
    """The highest RSS of ``pid`` while it runs (memory may go back before the response)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self._done = pid, 0.0, threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, _rss_mib(self.pid))
            time.sleep(0.002)  # the sampling interval

    def stop(self) -> float:
        self._done.set()
        self.join()
        return self.peak


def _binary_request(rows: int) -> tuple[bytes, dict]:
    rng = np.random.default_rng(rows)
    des = rng.random((rows, 13), dtype=np.float32)
    cat = rng.integers(0, 5000, (rows, 8)).astype(np.int64)
    header = json.dumps({
        "inputs": [
            {"name": "DES", "datatype": "FP32", "shape": [rows, 13],
             "parameters": {"binary_data_size": des.nbytes}},
            {"name": "CATCOLUMN", "datatype": "INT64", "shape": [rows, 8],
             "parameters": {"binary_data_size": cat.nbytes}},
        ],
        "parameters": {"binary_data_output": True},
    }).encode()  # fmt: skip
    return header + des.tobytes() + cat.tobytes(), {
        "Inference-Header-Content-Length": str(len(header))
    }


def test_rss_falls_back_after_a_large_request(tiny_repository):
    repo = tiny_repository(max_batch_size=65536)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tierserve.clients.cli", "serve", "--model-repository", str(repo),
         "--http-port", str(port), "--no-grpc", "--log-level", "warning"],
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/v2/models/dlrm/infer"
    try:

        def ready() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/v2/health/ready").status_code == 200
            except httpx.TransportError:
                return False

        assert until(ready, timeout=60)
        body, headers = _binary_request(2048)  # the usual sizes: warm, and nothing to give back
        assert httpx.post(url, content=body, headers=headers, timeout=60).status_code == 200
        warm = settled(lambda: _rss_mib(server.pid), tolerance=1.0)
        body, headers = _binary_request(65536)
        sampler = _PeakSampler(server.pid)
        sampler.start()
        try:
            assert httpx.post(url, content=body, headers=headers, timeout=120).status_code == 200
        finally:
            peak = sampler.stop()
        del body
        assert peak - warm > 40, (warm, peak)  # the request did need memory
        # nearly all it took is given back (all stayed before the trimmer; then, at times, a
        # quarter: the free top of the inference thread's arena)
        assert until(lambda: _rss_mib(server.pid) < warm + 0.15 * (peak - warm), timeout=10), (
            warm,
            peak,
            _rss_mib(server.pid),
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
