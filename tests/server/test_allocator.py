"""tune_malloc sets glibc's thresholds (and is a no-op elsewhere)."""

from __future__ import annotations

import platform
import subprocess
import sys


def test_tune_malloc_in_a_fresh_process():
    # A child process: the test process's own allocator is left alone.
    code = (
        "from tierserve.server.allocator import tune_malloc; import numpy as np; "
        "ok = tune_malloc(); a = [np.ones((1024, 512), np.float32) for _ in range(8)]; "
        "print(ok, float(sum(x.sum() for x in a)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    ok, total = out.stdout.split()
    assert float(total) == 8 * 1024 * 512
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert ok == "True"


def test_serve_flag_turns_it_off():
    from tierserve.clients.cli import build_parser
    from tierserve.clients.serve import settings_from_args

    parser = build_parser()
    on = settings_from_args(parser.parse_args(["serve", "--model-repository", "r"]))
    off = settings_from_args(
        parser.parse_args(["serve", "--model-repository", "r", "--no-malloc-tuning"])
    )
    assert on.malloc_tuning and not off.malloc_tuning
