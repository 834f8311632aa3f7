"""clients/make_step.py, the Makefile's step runner: a silent command still shows a line every few
seconds, its lines are relayed (``\\r`` redraws as lines, ``--only`` filters), and its exit
status is the step's."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

STEP = Path(__file__).resolve().parents[2] / "clients" / "make_step.py"


def _run(*args: str) -> tuple[int, list[tuple[float, str]]]:
    proc = subprocess.Popen([sys.executable, str(STEP), *args], stdout=subprocess.PIPE, text=True)
    started, lines = time.monotonic(), []
    for line in proc.stdout:
        lines.append((time.monotonic() - started, line.rstrip("\n")))
    return proc.wait(), lines


def test_a_silent_step_says_it_is_alive_and_passes_its_status_on():
    code, lines = _run("waiting", "--", "sh", "-c", "sleep 7; echo done; exit 3")
    assert code == 3
    texts = [text for _, text in lines]
    assert texts[0] == "[make] waiting ..."
    assert any(text.startswith("[make] waiting: still running (") for text in texts), texts
    assert "  done" in texts and texts[-1].startswith("[make] waiting: failed (exit 3) in ")
    times = [0.0] + [t for t, _ in lines]
    assert max(b - a for a, b in zip(times, times[1:])) < 7.0  # never silent for the sleep


def test_lines_are_relayed_filtered_and_redraws_split():
    script = "printf 'Collecting a\\nnoise\\nCollecting b\\r50%%\\rCollecting c\\n'"
    code, lines = _run("pip", "--only", "^Collecting", "--", "sh", "-c", script)
    assert code == 0
    relayed = [text for _, text in lines if text.startswith("  ")]
    assert relayed == ["  Collecting a", "  Collecting b", "  Collecting c"]
