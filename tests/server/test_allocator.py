"""tune_malloc sets glibc's thresholds (and is a no-op elsewhere)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest


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


_GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@pytest.mark.skipif(not _GLIBC, reason="arenas and trimming are glibc's")
def test_a_threads_arena_gives_back_its_free_top():
    # A large batch ran on an inference thread: its blocks sit at the top of that thread's
    # arena, which malloc_trim leaves alone; release_thread_arena on that thread gives it back.
    code = """
import ctypes, json, os, threading
from tierserve.server import allocator

def rss_anon_mib():  # statm: resident and shared pages; os.read allocates no malloc block
    fd = os.open("/proc/self/statm", os.O_RDONLY)
    fields = os.read(fd, 200).split()
    os.close(fd)
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE") / 2**20

assert allocator.tune_malloc()
out = {}

def batch():
    blocks = [allocator._malloc(4 << 20) for _ in range(10)]  # 40 MiB in this arena
    for block in blocks:
        ctypes.memset(block, 1, 4 << 20)
    out["peak"] = rss_anon_mib()
    for block in blocks:
        allocator._free(block)  # they join the arena's free top
    allocator.trimmer._trim(0)
    out["trimmed"] = rss_anon_mib()
    out["released"] = allocator.release_thread_arena()
    out["after"] = rss_anon_mib()

thread = threading.Thread(target=batch)
thread.start()
thread.join()
print(json.dumps(out))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    rss = json.loads(out.stdout)
    assert rss["released"] is True
    assert rss["after"] < rss["peak"] - 30, rss


def test_release_does_nothing_without_tuning():
    code = "from tierserve.server import allocator; print(allocator.release_thread_arena())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
