"""``tierserve serve``'s BLAS thread count (``--blas-threads``, default 1) is the one numpy's
BLAS runs with, although building the command line (other commands' modules) loads numpy
before ``serve`` runs.  Each case runs the real command line in a fresh interpreter (the
count is per process); the server itself does not start (its ``ps.json`` is missing)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tierserve.model.blas_threads import get_blas_threads

BLAS_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")

PROBE = """
import os, sys
from tierserve.clients.cli import main
code = main(["serve", "--config", sys.argv[1], *sys.argv[2:]])
from tierserve.model.blas_threads import get_blas_threads
print(code, get_blas_threads(), os.environ.get("OPENBLAS_NUM_THREADS"))
"""

pytestmark = pytest.mark.skipif(
    get_blas_threads() is None, reason="numpy's BLAS is not OpenBLAS (count not readable)"
)


def serve(tmp_path, *args: str, env: dict[str, str] | None = None):
    clean = {k: v for k, v in os.environ.items() if k not in BLAS_VARS}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "missing-ps.json"), *args],
        env={**clean, **(env or {})}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    code, threads, variable = done.stdout.split()
    return int(code), int(threads), variable, done.stderr


def test_the_default_is_one_blas_thread(tmp_path):
    code, threads, variable, err = serve(tmp_path)
    assert code == 2 and "missing-ps.json" in err  # stopped at the missing config, after
    assert threads == 1
    assert variable == "1"  # worker processes read it when they load numpy


def test_blas_threads_is_the_count_numpy_runs_with(tmp_path):
    want = (os.cpu_count() or 1) + 1  # differs from OpenBLAS's own default (one per core)
    code, threads, variable, _ = serve(tmp_path, "--blas-threads", str(want))
    assert code == 2
    assert threads == want
    assert variable == str(want)


def test_an_environment_count_is_left_alone_without_the_option(tmp_path):
    # OpenBLAS caps a count read from the environment at the cores; the option's 1 is not
    # applied over it: all cores (or 1 on a machine of one core) is what it was given
    want = min(2, os.cpu_count() or 1)
    code, threads, variable, _ = serve(tmp_path, env={"OPENBLAS_NUM_THREADS": str(want)})
    assert threads == want and variable == str(want)


def test_a_count_below_one_is_refused_naming_the_option(tmp_path):
    code, _, _, err = serve(tmp_path, "--blas-threads", "0")
    assert code == 2
    assert "--blas-threads 0" in err
