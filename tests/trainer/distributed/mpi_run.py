"""Running a script under ``mpiexec -n N`` (or as one process) from a test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def mpiexec() -> str:
    """The venv's ``mpiexec`` (the ``mpi`` extra's MPICH), or skip the test."""
    beside = Path(sys.executable).parent / "mpiexec"
    found = str(beside) if beside.exists() else shutil.which("mpiexec")
    if found is None:
        pytest.skip("needs mpiexec: pip install 'tierserve[mpi]'")
    pytest.importorskip("mpi4py")
    return found


def run(ranks: int, script: str | Path, timeout: float = 90, **settings) -> subprocess.CompletedProcess:
    """Run ``script`` on ``ranks`` ranks (``ranks == 0``: a plain process, no launcher) with
    ``settings`` in its environment, one BLAS thread per rank; returns the finished process."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "OMPI_", "PMIX_", "HYDRA_"))}
    env.update(TIERSERVE_FORCE_CPU="1", TIERSERVE_NO_PROGRESS="1", OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.update({k: str(v) for k, v in settings.items()})
    cmd = [sys.executable, str(script)]
    if ranks:
        cmd = [mpiexec(), "-n", str(ranks), *cmd]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
