"""bench/trainer/mpi.py, small: the DLRM of the scaling benchmark trains on 2 ranks to 1 rank's
dense weights, each rank sending at most 1.5x the minimum bytes per step (its distinct remote
keys' vectors and gradients plus its share of the dense allreduce).  Speed is the
benchmark's figure, not a test's: the cores are shared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .mpi_run import mpiexec

REPOSITORY = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.slow


def test_two_ranks_send_near_the_minimum_and_train_as_one_rank():
    mpiexec()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PMI_", "OMPI_", "PMIX_", "HYDRA_"))}
    done = subprocess.run(
        [sys.executable, "-m", "bench.trainer.mpi", "--ranks", "1,2", "--steps", "3",
         "--warmup", "1", "--batch", "1024", "--rounds", "1", "--json"],
        capture_output=True, text=True, timeout=240, cwd=REPOSITORY, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = json.loads(done.stdout.strip().splitlines()[-1])
    assert (one["ranks"], two["ranks"]) == (1, 2)
    assert two["remote_keys_per_step"] > 0  # the tables really are sharded
    assert two["bytes_per_step"] <= 1.5 * two["min_bytes_per_step"]
    assert two["dense_vs_base"] < 1e-4
