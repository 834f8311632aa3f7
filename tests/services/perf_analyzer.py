"""``perf_analyzer``, Triton's load generator, as tritonclient's wheel ships it.

tritonclient (the ``[all]`` extra of the dev group) puts the binary beside this interpreter
(``<venv>/bin/perf_analyzer``), without two shared libraries it links:

- ``libcudart.so.12``: from the PyPI wheel ``nvidia-cuda-runtime-cu12``, installed with
  ``pip install --no-deps --target <cache>/cudart`` (never into the virtual environment); it
  is only loaded, no GPU is needed;
- ``libb64.so.0d``: Debian's ``libb64-0d`` (apt-get, when the linker does not find it).

:meth:`PerfAnalyzer.run` runs it with ``<cache>/cudart``'s library folder on
``LD_LIBRARY_PATH`` and reads the CSV it writes (``-f``): one row per concurrency.
"""

from __future__ import annotations

import csv
import ctypes.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .install import (
    InstallError,
    announce,
    apt_install,
    cache_root,
    install_lock,
    read_marker,
    run_checked,
    write_marker,
)

CUDART_REQUIREMENT = "nvidia-cuda-runtime-cu12==12.9.79"
B64_PACKAGE = "libb64-0d"


class UnstableMeasurement(AssertionError):
    """perf_analyzer found no window of stable throughput and latency (a busy machine):
    give it a wider ``--stability-percentage`` or a longer ``--measurement-interval``."""


@dataclass(frozen=True)
class Measurement:
    """One concurrency of a run: requests/s and client-side latency percentiles (ms)."""

    concurrency: int
    throughput: float  # inferences per second (requests/s at batch 1)
    p50_ms: float
    p90_ms: float
    p99_ms: float


@dataclass(frozen=True)
class PerfAnalyzer:
    """An installed perf_analyzer: the binary and the folder holding ``libcudart.so.12``."""

    binary: Path
    cudart_libs: Path

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        paths = [str(self.cudart_libs), *filter(None, [env.get("LD_LIBRARY_PATH")])]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(paths)
        return env

    def run(self, args: Sequence[str], timeout: float = 300.0) -> list[Measurement]:
        """Run ``perf_analyzer ARGS -f <csv>``; the measurements, or an AssertionError with
        its output when it exits non-zero or measures nothing."""
        with tempfile.TemporaryDirectory(prefix="perf-analyzer-") as tmp:
            report = Path(tmp) / "report.csv"
            argv = [str(self.binary), *args, "-f", str(report)]
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, text=True, timeout=timeout,
                                  env=self.environment())  # fmt: skip
            if proc.returncode != 0 or not report.exists():
                if "Failed to obtain stable measurement" in proc.stdout:
                    raise UnstableMeasurement(f"`{' '.join(argv)}`: {proc.stdout[-1000:]}")
                raise AssertionError(
                    f"`{' '.join(argv)}` exited with {proc.returncode}:\n{proc.stdout[-4000:]}"
                )
            rows = read_report(report)
        if not rows:
            raise AssertionError(f"`{' '.join(argv)}` measured nothing:\n{proc.stdout[-4000:]}")
        return rows


def read_report(path: Path) -> list[Measurement]:
    """The rows of a perf_analyzer CSV report by concurrency (perf_analyzer orders them by
    throughput; latencies there are in microseconds)."""
    with open(path, newline="") as f:
        rows = [
            Measurement(
                concurrency=int(row["Concurrency"]),
                throughput=float(row["Inferences/Second"]),
                p50_ms=float(row["p50 latency"]) / 1e3,
                p90_ms=float(row["p90 latency"]) / 1e3,
                p99_ms=float(row["p99 latency"]) / 1e3,
            )
            for row in csv.DictReader(f)
        ]
    return sorted(rows, key=lambda r: r.concurrency)


def write_input_data(path: Path, requests: Sequence[dict[str, np.ndarray]]) -> Path:
    """A ``--input-data`` file: perf_analyzer sends ``requests`` in turn, each tensor with its
    values and shape as given (for a model with ``max_batch_size`` > 0: one row, without the
    batch dimension; perf_analyzer repeats it ``-b`` times)."""
    steps = [
        {name: {"content": array.reshape(-1).tolist(), "shape": list(array.shape)}
         for name, array in request.items()}
        for request in requests
    ]  # fmt: skip
    path.write_text(json.dumps({"data": steps}))
    return path


def ensure_perf_analyzer() -> PerfAnalyzer:
    """perf_analyzer with its two libraries installed (each at most once)."""
    binary = Path(sys.executable).parent / "perf_analyzer"
    if not binary.exists():
        raise InstallError(
            f"{binary} is missing: perf_analyzer comes with tritonclient's wheel "
            "(pip install 'tritonclient[all]')"
        )
    if ctypes.util.find_library("b64") is None:
        apt_install([B64_PACKAGE])
        if ctypes.util.find_library("b64") is None:
            raise InstallError(f"installed {B64_PACKAGE}, yet the linker does not find libb64")
    home = cache_root() / "cudart"
    marker = home / ".installed"
    if read_marker(marker) != CUDART_REQUIREMENT:
        with install_lock("cudart"):
            if read_marker(marker) != CUDART_REQUIREMENT:
                announce(f"installing {CUDART_REQUIREMENT} into {home}")
                run_checked(
                    [sys.executable, "-m", "pip", "install", "--quiet",
                     "--disable-pip-version-check", "--no-deps", "--only-binary=:all:",
                     "--upgrade", "--target", str(home), CUDART_REQUIREMENT],
                    f"pip install {CUDART_REQUIREMENT}",
                    timeout=600,
                )  # fmt: skip
                write_marker(marker, CUDART_REQUIREMENT)
    libs = home / "nvidia" / "cuda_runtime" / "lib"
    if not (libs / "libcudart.so.12").exists():
        raise InstallError(f"{CUDART_REQUIREMENT} installed no {libs / 'libcudart.so.12'}")
    return PerfAnalyzer(binary, libs)
