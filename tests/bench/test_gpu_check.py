"""bench/gpu/check.sh, the prepared GPU check, run end to end on the CPU (``--cpu-dry-run``:
the same stages on numpy with tiny sizes), so that a session lent a GPU finds it working up
to the GPU-specific calls; and its summary, which must show a failed step or part as such."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_dry_run_runs_every_step_and_writes_the_summary(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path)}
    env.pop("TIERSERVE_FORCE_CPU", None)
    done = subprocess.run(
        ["bash", str(ROOT / "bench/gpu/check.sh"), "--cpu-dry-run", "--no-install",
         "--venv", sys.prefix, "--seconds", "400"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=420,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["device"].startswith("CPU dry run")
    steps = report["results"]["steps"]
    assert {k: v["status"] for k, v in steps.items()} == dict.fromkeys(
        ["doctor", "tests", "cache", "trainer", "server"], "ok")
    assert report["results"]["tests"]["failed"] == 0 and report["results"]["tests"]["passed"] > 0
    figures = [row["figure"] for row in report["summary"]]
    for wanted in ("cache hits dim 16", "cache hits dim 128", "Zipf 1.2", "insert new keys",
                   "update cached rows", "trainer tierserve CPU, samples/s", "|AUC GPU - tierserve CPU|",
                   "served p50, batch 1", "served p50, batch 64", "served p50, batch 1024"):
        assert any(wanted in f for f in figures), (wanted, figures)
    assert not [r for r in report["summary"] if r["met"] == "NO"], report["summary"]
    auc = report["results"]["trainer"]["result"]["auc"]["auc"]
    assert auc["tierserve CPU"] == auc["tierserve (dry run)"]  # same weights, same arithmetic
    assert (tmp_path / "gpu_check.log").stat().st_size > 0


def test_a_failed_step_or_part_shows_in_the_summary():
    sys.path.insert(0, str(ROOT))
    try:
        from bench.gpu.run import summary_rows
    finally:
        sys.path.remove(str(ROOT))
    rows = summary_rows({
        "steps": {"install": {"status": "ok"}, "trainer": {"status": "timed out after 150s"}},
        "tests": {"line": "3 failed, 40 passed", "failed": 3, "errors": 0},
        "cache": {"result": {"hits": {"error": "CUDARuntimeError: out of memory"},
                             "powerlaw": {}, "writes": []}},
        "server": {"result": {"latency": {
            "CPU path (no cache)": {"1024": {"p50_ms": 40.0}},
            "GPU cache": {"1024": {"p50_ms": 10.0}}}}},
    })
    failed = {r[0]: r[1] for r in rows if r[3] == "NO"}
    assert failed == {
        "step trainer": "timed out after 150s",
        "GPU-marked tests": "3 failed, 40 passed",
        "cache hits": "CUDARuntimeError: out of memory",
        "trainer stage": "did not run / no result",
    }
    served = next(r for r in rows if r[0] == "served p50, batch 1024")
    assert "(4.00x)" in served[1] and served[3] == "yes"
