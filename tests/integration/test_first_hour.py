"""A new user's first hour, scripted, on a fresh copy of the checkout.

The copy holds what a clone would (tracked files and new ones, nothing git ignores), the user
has a fresh HOME (its ``.cache/tierserve`` is the test cache, so ``tierserve triton-install``
finds the tritonserver the suite installs; pip keeps its own cache), and every code block of
README.md runs in order, as written: ``make demo`` creates ``.venv`` with the README's install
line, the install lines run in it, the demo's model is served and asked, a model of one's own
is trained with ``fit(repository=...)`` and served, and the demo's repository is served by
tritonserver.  Ports are moved to free ones; a line marked ``# not run in CI: why`` is skipped
(the README says why beside it).  ``make demo`` must print a line at least every 10 s.

Then what a user runs into with that install: the demo on a busy port, a broken ``ps.json``
under ``--workers 2``, and the first request after the server says ready (within 3x the
median CPU time of the next 100).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from polling import until
from serve_process import cpu_seconds
from services.install import cache_root
from services.triton import ensure_tritonserver

from tierserve.server.app import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NOT_RUN = "# not run in CI:"
#: The longest a step of `make demo` may stay silent.
MAX_SILENCE_S = 10.0
BLOCK_TIMEOUT_S = 1200


@dataclass
class Block:
    language: str
    text: str
    output: str = ""
    lines: list[tuple[float, str]] | None = None  # (seconds since start, line)
    returncode: int | None = None


def readme_blocks() -> list[Block]:
    text = (ROOT / "README.md").read_text()
    return [Block(lang, body) for lang, body in re.findall(r"```(bash|python)\n(.*?)```", text, re.S)]


def copy_checkout(target: Path) -> None:
    """What a clone of the checkout would hold, with its uncommitted changes."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, capture_output=True, check=True).stdout  # fmt: skip
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)


def run_script(script: str, cwd: Path, env: dict, timeout: float) -> tuple[int, list]:
    """Run ``script`` with bash (-e, pipefail) in a process group of its own; its output
    lines with the time each came; what it left running is killed with the group."""
    proc = subprocess.Popen(["bash", "-e", "-o", "pipefail", "-c", script], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    lines: list[tuple[float, str]] = []
    started = time.monotonic()

    def read() -> None:
        for raw in proc.stdout:
            lines.append((time.monotonic() - started, raw.decode(errors="replace").rstrip()))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        reader.join(timeout=10)
    return code, lines


class FirstHour:
    """The copy, the user's environment, and the README's blocks once run."""

    def __init__(self, base: Path) -> None:
        ensure_tritonserver()  # what `tierserve triton-install` finds in the user's cache
        self.clone = base / "clone"
        copy_checkout(self.clone)
        home = base / "home"
        (home / ".cache").mkdir(parents=True)
        (home / ".cache" / "tierserve").symlink_to(cache_root())
        self.ports = {8000: free_port(), 8001: free_port(), 8100: free_port(),
                      8101: free_port(), 8102: free_port()}  # fmt: skip
        self.bin = self.clone / ".venv" / "bin"
        env = {k: v for k, v in os.environ.items()
               if k not in ("VIRTUAL_ENV", "PYTHONPATH", "TIERSERVE_NO_PROGRESS",
                            "TIERSERVE_ADMIN_TOKEN", "NUMBA_CACHE_DIR")}  # fmt: skip
        env["PIP_CACHE_DIR"] = env.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
        env.update(HOME=str(home), PATH=f"{self.bin}{os.pathsep}{env['PATH']}",
                   DEMO_ARGS=f"--exit-after-check --http-port {self.ports[8000]} "
                             f"--grpc-port {self.ports[8001]}")  # fmt: skip
        self.env = env
        self.blocks = readme_blocks()
        for block in self.blocks:
            self._run(block)
            if block.returncode != 0:
                break

    def script(self, block: Block) -> str:
        kept = []
        for line in block.text.splitlines():
            if NOT_RUN in line:
                assert line.split(NOT_RUN, 1)[1].strip(), f"no reason given: {line}"
                continue
            for port, free in self.ports.items():
                line = re.sub(rf"\b{port}\b", str(free), line)
            kept.append(line)
        return "\n".join(kept) + "\n"

    def _run(self, block: Block) -> None:
        if block.language == "python":
            name = re.match(r"# (\S+\.py)", block.text)
            assert name, "a README python block starts with '# <file>.py' naming the file"
            (self.clone / name.group(1)).write_text(block.text)
            block.returncode = 0
            return
        block.returncode, block.lines = run_script(self.script(block), self.clone, self.env,
                                                   BLOCK_TIMEOUT_S)  # fmt: skip
        block.output = "\n".join(line for _, line in block.lines)

    def block_with(self, text: str) -> Block:
        return next(b for b in self.blocks if text in b.text)

    def tierserve(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin / "tierserve"), *args], cwd=self.clone, env=self.env,
                              capture_output=True, text=True, timeout=timeout)  # fmt: skip


@pytest.fixture(scope="module")
def first_hour(tmp_path_factory):
    return FirstHour(tmp_path_factory.mktemp("first-hour"))


def _last_json(output: str) -> dict:
    """The last JSON object in ``output`` (curl -s prints answers without a newline, so
    several may share a line)."""
    decoder = json.JSONDecoder()
    found = None
    for line in output.splitlines():
        at = line.find("{")
        while at >= 0:
            try:
                found, end = decoder.raw_decode(line, at)
            except json.JSONDecodeError:
                end = at + 1
            at = line.find("{", end)
    assert isinstance(found, dict), f"no JSON answer in:\n{output[-3000:]}"
    return found


def test_every_readme_block_runs_as_written(first_hour):
    for block in first_hour.blocks:
        assert block.returncode == 0, f"README block failed ({block.returncode}):\n" \
            f"{block.text}\n--- output ---\n{block.output[-6000:]}"  # fmt: skip


def test_make_demo_prints_a_line_at_least_every_10_s(first_hour):
    block = first_hour.block_with("make demo")
    assert block.returncode == 0, block.output[-6000:]
    assert "click probability:" in block.output
    times = [0.0] + [t for t, _ in block.lines]
    gaps = [(b - a, line) for a, b, (_, line) in zip(times, times[1:], block.lines)]
    longest = max(gaps)
    assert longest[0] <= MAX_SILENCE_S, f"{longest[0]:.1f} s of silence before: {longest[1]}"
    # it installed tierserve with the README's install line, and no more
    assert "pip install -e .)" in block.output and "--group dev" not in block.output


def test_the_demo_model_answers_alike_from_tierserve_and_tritonserver(first_hour):
    served = _last_json(first_hour.block_with("--model-repository .demo/repository --http-port").output)
    [[score]] = served["outputs"]["OUTPUT0"]
    assert 0.0 < score < 1.0
    triton = first_hour.block_with("tierserve triton-repo")
    assert triton.returncode == 0, triton.output[-6000:]
    assert "writable rocks_db" in triton.output  # the demo's ps.json, served as it is
    [output] = _last_json(triton.output)["outputs"]
    assert output["name"] == "OUTPUT0" and output["shape"] == [1, 1]
    assert abs(output["data"][0] - score) < 1e-5


def test_a_model_of_ones_own_trained_with_fit_is_served(first_hour):
    block = first_hour.block_with("python own_model.py")
    assert block.returncode == 0, block.output[-6000:]
    assert (first_hour.clone / "models" / "ps.json").is_file()
    [[score]] = _last_json(block.output)["outputs"]["OUTPUT0"]
    assert 0.0 < score < 1.0


def test_the_demo_on_a_busy_port_stops_before_training_naming_it(first_hour, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert _free(port - 1), "the port below the busy one is taken; run again"
        for args, option in ((["--http-port", str(port)], f"--http-port {port}"),
                             (["--http-port", str(port - 1)], f"--grpc-port {port}")):  # fmt: skip
            result = first_hour.tierserve("demo", "--workdir", str(tmp_path), "--exit-after-check",
                                          *args, timeout=120)  # fmt: skip
            assert result.returncode == 2, result
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and option in lines[0] and "in use" in lines[0], lines
            assert "training" not in result.stdout and not (tmp_path / "train").exists()


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_broken_ps_json_is_refused_in_one_line_with_two_workers(first_hour, tmp_path):
    repo = tmp_path / "repository"
    shutil.copytree(first_hour.clone / ".demo" / "repository", repo)
    config = json.loads((repo / "ps.json").read_text())
    config["volatile_db"]["type"] = "hashmap"
    (repo / "ps.json").write_text(json.dumps(config))
    result = first_hour.tierserve("serve", "--model-repository", str(repo), "--workers", "2",
                                  "--http-port", str(free_port()), "--grpc-port",
                                  str(free_port()), timeout=120)  # fmt: skip
    assert result.returncode == 2, result
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert str(repo / "ps.json") in lines[0] and "volatile_db.type: 'hashmap'" in lines[0]
    assert "hash_map, parallel_hash_map" in lines[0] and "Traceback" not in lines[0]


#: The pause before each request of the comparison (before the first, the server's
#: inference thread has been idle since its warm-up, seconds).
PAUSE_S = 0.05


def _first_and_next(
    http_port: int, pid: int, body: bytes, count: int = 100
) -> tuple[float, list[float]]:
    """The server's CPU time (:func:`cpu_seconds`) for its first infer request after ready
    and for the ``count`` after it."""
    client = http.client.HTTPConnection("127.0.0.1", http_port, timeout=30)

    def ready() -> bool:
        try:
            client.request("GET", "/v2/health/ready")
            reply = client.getresponse()
            reply.read()
            return reply.status == 200
        except OSError:
            client.close()
            return False

    assert until(ready, timeout=300, interval=0.1)

    def infer() -> float:
        started = cpu_seconds(pid)
        client.request("POST", "/v2/models/dlrm/infer", body, {"Content-Type": "application/json"})
        reply = client.getresponse()
        reply.read()
        assert reply.status == 200
        return cpu_seconds(pid) - started

    try:
        first = infer()
        rest = []
        for _ in range(count):
            time.sleep(PAUSE_S)
            rest.append(infer())
        return first, rest
    finally:
        client.close()


def test_the_first_request_after_ready_is_as_fast_as_the_rest(first_hour):
    """The server's CPU time for its first request is within 3x the median of the next 100.
    Each try is a fresh server process: were the model's first-run costs left to the first
    request, it would take 10 to 7,000 times the median (numba's kernels loaded from their
    disk cache, or compiled; 12-13x in CPU time with the warm-up removed), in every try.

    CPU time, not wall clock: on a loaded machine a single request's wall time is mostly
    its wait for a core (0.1x to 4.7x the median with two busy loops beside it, the CPU time
    1.0x to 1.6x).  The next 100 are sent as the first was, after a pause: a request that
    follows a pause pays for caches other processes took over meanwhile (about 1 ms of CPU
    per thread on this 2-core VM), which back-to-back requests do not.  Up to three tries."""
    body = json.dumps({"inputs": [
        {"name": "DES", "datatype": "FP32", "shape": [1, 13], "data": [0.5] * 13},
        {"name": "CATCOLUMN", "datatype": "INT64", "shape": [1, 8],
         "data": [3, 107, 211, 250, 1007, 1200, 2000, 3000]}]}).encode()  # fmt: skip
    ratios = []
    for _ in range(3):
        port = free_port()
        server = subprocess.Popen(
            [str(first_hour.bin / "tierserve"), "serve", "--model-repository",
             ".demo/repository", "--http-port", str(port), "--no-grpc", "--workers", "1",
             "--log-level", "warning"],
            cwd=first_hour.clone, env=first_hour.env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            first, rest = _first_and_next(port, server.pid, body)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
        ratios.append(first / statistics.median(rest))
        if ratios[-1] <= 3.0:
            break
    assert min(ratios) <= 3.0, ratios
