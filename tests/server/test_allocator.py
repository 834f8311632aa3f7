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
        "from tierserve.server.runtime.allocator import tune_malloc; import numpy as np; "
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
from tierserve.server.runtime import allocator

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
    code = "from tierserve.server.runtime import allocator; print(allocator.release_thread_arena())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.skipif(not _GLIBC, reason="arenas and trimming are glibc's")
def test_a_large_batchs_arena_gives_back_what_its_outputs_held_at_the_top():
    # The batch's temporaries are freed on the inference thread, but its outputs sit above
    # them at the top of that thread's arena until the response is sent: freed then (on the
    # event loop), they join everything below into a free top that malloc_trim leaves alone
    # and that the 1 GiB threshold keeps.  The trim after the request frees a block of that
    # arena held since the batch, under the low threshold: the top goes back.
    code = """
import ctypes, json, os, threading, time
from tierserve.server.runtime import allocator
from tierserve.server.runtime.allocator import LARGE_ROWS

def rss_anon_mib():
    fd = os.open("/proc/self/statm", os.O_RDONLY)
    fields = os.read(fd, 200).split()
    os.close(fd)
    return (int(fields[1]) - int(fields[2])) * os.sysconf("SC_PAGE_SIZE") / 2**20

assert allocator.tune_malloc()
trimmer = allocator.Trimmer()
out = {}

def batch():
    temporaries = [allocator._malloc(4 << 20) for _ in range(10)]  # 40 MiB
    for block in temporaries:
        ctypes.memset(block, 1, 4 << 20)
    out["output"] = allocator._malloc(256 << 10)  # above them: the arena's top
    ctypes.memset(out["output"], 1, 256 << 10)
    out["peak"] = rss_anon_mib()
    for block in temporaries:
        allocator._free(block)
    trimmer.after_batch(LARGE_ROWS)  # as the data plane calls it after a batch

thread = threading.Thread(target=batch)
thread.start()
thread.join()
allocator._free(out.pop("output"))  # the response is sent
trimmer.after(LARGE_ROWS, 0)  # as the REST route calls it after the request
deadline = time.monotonic() + 30
while trimmer.trims == 0 and time.monotonic() < deadline:
    time.sleep(0.05)
out["trims"] = trimmer.trims
out["after"] = rss_anon_mib()
print(json.dumps(out))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    rss = json.loads(out.stdout)
    assert rss["trims"] >= 1, rss
    assert rss["after"] < rss["peak"] - 30, rss


@pytest.fixture(autouse=True, scope="module")
def _an_opted_out_parent():
    """The test process opted out (as after a BackgroundServer): the children inherit it."""
    from tierserve.server.runtime.allocator import disable_transparent_hugepages

    disable_transparent_hugepages(True)


_THP_STATE = (
    "import json, re; from tierserve.server.runtime.allocator import "
    "transparent_hugepages_disabled; "
    "status = open('/proc/self/status').read(); m = re.search(r'THP_enabled:\\s*(\\d)', status); "
    "print(json.dumps([transparent_hugepages_disabled(), m and int(m.group(1))]))"
)


def _hosting_process_thp(transparent_hugepages: bool | None) -> list:
    """[opted out, the kernel's THP_enabled] of a fresh process that applied the server's
    process settings (``server.app.hugepages_setting``, which ``serve()`` and
    ``BackgroundServer`` call) with ``transparent_hugepages`` (None: the default)."""
    setting = "" if transparent_hugepages is None else f"transparent_hugepages={transparent_hugepages}"
    code = (
        "from tierserve.server.app import hugepages_setting; "
        "from tierserve.server.settings import Settings; "
        f"hugepages_setting(Settings.build({setting})); " + _THP_STATE
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.skipif(platform.system() != "Linux", reason="PR_SET_THP_DISABLE is Linux's")
def test_the_server_process_opts_out_of_transparent_hugepages_unless_asked():
    # khugepaged scanning the process at the lowest priority froze it on a busy machine (see
    # disable_transparent_hugepages); the kernel's own view (THP_enabled) must say it is off.
    disabled, kernel = _hosting_process_thp(None)
    assert disabled is True
    if kernel is not None:  # /proc/self/status has THP_enabled since Linux 6.x
        assert kernel == 0
    assert _hosting_process_thp(True)[0] is False  # even when the parent had opted out


def test_the_flag_keeps_transparent_hugepages():
    from tierserve.clients.cli import build_parser
    from tierserve.clients.serve import settings_from_args

    parser = build_parser()
    default = settings_from_args(parser.parse_args(["serve", "--model-repository", "r"]))
    kept = settings_from_args(
        parser.parse_args(["serve", "--model-repository", "r", "--transparent-hugepages"])
    )
    assert not default.transparent_hugepages and kept.transparent_hugepages
