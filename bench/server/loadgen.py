"""Load generators for the serving benchmarks: many concurrent clients sending one pre-built
request, closed loop (each client sends its next request when its reply is in).

Two kinds, the same request bytes for both:

- ``native`` (the default where installed; ``sh bench/server/install_loadgen.sh`` installs
  it): ``wrk`` for HTTP/1.1 (one keep-alive connection per client; a Lua script POSTs the
  request and counts every reply whose status is not 200) and ``h2load`` for gRPC (HTTP/2,
  ``content-type: application/grpc``, the 5-byte-framed message; by default one connection
  per client).  Their own CPU per request is a few tens of microseconds, against about
  0.1-0.2 ms for the Python one, so on a small machine the servers keep the cores.
  ``h2load`` does not read gRPC trailers, so a reply is checked by its size: one call made
  first with grpcio must answer (status 0), and every reply of the run must carry that
  call's number of DATA bytes; an error reply carries none.
- ``python``: asyncio in this process (raw HTTP/1.1 keep-alive sockets; ``grpc.aio``
  channels), checking each reply's status; the fallback where the native tools are missing.

A run with any failed reply raises :class:`LoadError` naming how many failed and how.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

GENERATORS = ("auto", "native", "python")
GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"
INSTALL = "sh bench/server/install_loadgen.sh"


class LoadError(RuntimeError):
    """The load run got replies that failed the check (or could not run at all)."""


@dataclass(frozen=True)
class HttpRequest:
    """An HTTP POST: path, headers (Host and Content-Length are added) and body."""

    path: str
    headers: dict[str, str]
    body: bytes

    def raw(self, host: str) -> bytes:
        """The whole HTTP/1.1 request as sent on the wire."""
        head = f"POST {self.path} HTTP/1.1\r\nHost: {host}\r\n" + "".join(
            f"{k}: {v}\r\n" for k, v in self.headers.items()
        )
        return f"{head}Content-Length: {len(self.body)}\r\n\r\n".encode() + self.body


@dataclass
class LoadResult:
    """What one run did: requests answered, over how long, and the generator's CPU."""

    generator: str
    requests: int
    seconds: float
    cpu_s: float
    details: dict = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Requests answered per second."""
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_per_request(self) -> float:
        """The generator's own CPU seconds per request."""
        return self.cpu_s / max(self.requests, 1)


def native_available() -> bool:
    """Whether ``wrk`` and ``h2load`` are on PATH."""
    return shutil.which("wrk") is not None and shutil.which("h2load") is not None


def resolve(generator: str) -> str:
    """``native`` or ``python`` for a ``--loadgen`` value (``auto``: native where installed)."""
    if generator not in GENERATORS:
        raise ValueError(f"--loadgen {generator!r}: expected one of {', '.join(GENERATORS)}")
    if generator == "auto":
        return "native" if native_available() else "python"
    if generator == "native" and not native_available():
        raise LoadError(
            f"--loadgen native: wrk or h2load is missing; install them with `{INSTALL}`"
        )
    return generator


def _run_measured(argv: list[str], timeout: float) -> tuple[str, str, float]:
    """Run ``argv`` to its end: stdout, stderr and the CPU seconds it used (its rusage)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                raise LoadError(f"{argv[0]} ran past {timeout:.0f} s; killed")
            time.sleep(0.05)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode != 0:
        raise LoadError(f"{argv[0]} exited with {proc.returncode}: {(stderr or stdout)[-800:]}")
    return stdout, stderr, usage.ru_utime + usage.ru_stime


_WRK_SCRIPT = """
local f = assert(io.open(%(body)s, "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
%(headers)s
local threads = {}
function setup(thread) table.insert(threads, thread) end
bad = 0
last_bad = 0
function response(status, headers, body)
  if status ~= 200 then bad = bad + 1; last_bad = status end
end
function done(summary, latency, requests)
  local n, last = 0, 0
  for _, t in ipairs(threads) do
    n = n + t:get("bad")
    if t:get("last_bad") ~= 0 then last = t:get("last_bad") end
  end
  local e = summary.errors
  io.write(string.format(
    'WRK {"requests":%%d,"duration_us":%%d,"not_200":%%d,"last_status":%%d,"connect":%%d,' ..
    '"read":%%d,"write":%%d,"status":%%d,"timeout":%%d}\\n', summary.requests, summary.duration,
    n, last, e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def _lua_string(text: str) -> str:
    return json.dumps(text)  # a JSON string of ASCII text is a valid Lua string literal


def wrk_http(url: str, request: HttpRequest, clients: int, seconds: float) -> LoadResult:
    """``clients`` wrk connections POSTing ``request`` to ``url`` (host:port) for ``seconds``
    (whole seconds, at least one: wrk's unit)."""
    with tempfile.TemporaryDirectory(prefix="tierserve-wrk-") as tmp:
        body = Path(tmp) / "body"
        body.write_bytes(request.body)
        headers = "\n".join(
            f"wrk.headers[{_lua_string(k)}] = {_lua_string(v)}" for k, v in request.headers.items()
        )
        script = Path(tmp) / "post.lua"
        script.write_text(_WRK_SCRIPT % {"body": _lua_string(str(body)), "headers": headers})
        duration = max(1, round(seconds))
        stdout, stderr, cpu = _run_measured(
            ["wrk", "-t1", f"-c{clients}", f"-d{duration}s", "--timeout", "10s", "-s",
             str(script), f"http://{url}{request.path}"],
            timeout=duration + 60,
        )  # fmt: skip
    line = next((x for x in stdout.splitlines() if x.startswith("WRK ")), None)
    if line is None:
        raise LoadError(f"wrk printed no summary: {(stdout + stderr)[-800:]}")
    found = json.loads(line[4:])
    failed = {k: found[k] for k in ("not_200", "connect", "read", "write", "timeout") if found[k]}
    if failed or not found["requests"]:
        raise LoadError(
            f"HTTP load on {url}: {found['requests']} replies, failures {failed or 'none'}"
            + (f" (last status {found['last_status']})" if found["not_200"] else "")
            + ("; no reply at all" if not found["requests"] else "")
        )
    return LoadResult("wrk", found["requests"], found["duration_us"] / 1e6, cpu, found)


def grpc_reply_size(url: str, message: bytes, method: str = GRPC_INFER) -> int:
    """The framed size of the reply to ``message`` (one grpcio call, which must succeed)."""
    import grpc

    with grpc.insecure_channel(url) as channel:
        try:
            reply = channel.unary_unary(method)(message, timeout=60)
        except grpc.RpcError as exc:
            raise LoadError(f"gRPC {method} on {url}: {exc.code().name}: {exc.details()}") from None
    return 5 + len(reply)


_H2_REQUESTS = re.compile(
    r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, "
    r"(\d+) errored, (\d+) timeout"
)
_H2_FINISHED = re.compile(r"finished in ([\d.]+)(m?s)")
_H2_DATA = re.compile(r"\((\d+)\) data")


def h2load_grpc(
    url: str,
    message: bytes,
    clients: int,
    seconds: float,
    connections: int | None = None,
    method: str = GRPC_INFER,
) -> LoadResult:
    """``clients`` concurrent unary gRPC calls of ``message`` to ``url`` for ``seconds`` with
    h2load, over ``connections`` HTTP/2 connections (default one per client; ``clients`` must
    be a multiple of it)."""
    connections = connections or clients
    if clients % connections:
        raise ValueError(f"{clients} clients do not spread evenly over {connections} connections")
    expected = grpc_reply_size(url, message, method)
    with tempfile.NamedTemporaryFile(prefix="tierserve-h2load-") as data:
        data.write(len(message).to_bytes(5, "big") + message)  # flag 0, then u32 length
        data.flush()
        stdout, stderr, cpu = _run_measured(
            ["h2load", "-t1", f"-c{connections}", f"-m{clients // connections}",
             f"-D{max(1, round(seconds * 1000))}ms", "-d", data.name,
             "-H", "content-type: application/grpc", "-H", "te: trailers",
             f"http://{url}{method}"],
            timeout=seconds + 60,
        )  # fmt: skip
    counts, finished, traffic = (
        _H2_REQUESTS.search(stdout), _H2_FINISHED.search(stdout), _H2_DATA.search(stdout)
    )  # fmt: skip
    if not (counts and finished and traffic):
        raise LoadError(f"h2load printed no summary: {(stdout + stderr)[-800:]}")
    total, started, done, ok, failed, errored, timeout = (int(g) for g in counts.groups())
    data_bytes = int(traffic.group(1))
    found = {
        "requests": done, "started": started, "succeeded": ok, "failed": failed,
        "errored": errored, "timeout": timeout, "data_bytes": data_bytes,
        "reply_bytes": expected,
    }  # fmt: skip
    # every finished call carried the reply's DATA bytes; calls cut off at the end may too
    short = data_bytes < ok * expected or data_bytes > started * expected
    if failed or errored or timeout or not ok or ok != done or short:
        raise LoadError(
            f"gRPC load on {url}: {done} calls done, {ok} with HTTP status 2xx, {failed} failed, "
            f"{errored} errored, {timeout} timed out; {data_bytes} reply DATA bytes where "
            f"{expected} per call were expected: about {max(0, ok - data_bytes // expected)} "
            "calls had a non-zero grpc-status (their replies carry no data)"
        )
    elapsed = float(finished.group(1)) / (1000 if finished.group(2) == "ms" else 1)
    return LoadResult("h2load", ok, elapsed, cpu, found)


async def _python_grpc(url: str, message: bytes, clients: int, seconds: float,
                       connections: int, method: str) -> int:  # fmt: skip
    import grpc

    # a local subchannel pool: each channel its own connection
    channels = [
        grpc.aio.insecure_channel(url, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(connections)
    ]
    try:
        calls = [c.unary_unary(method) for c in channels]
        for call in calls:
            await call(message)  # connected, and the model answers
        done = 0
        stop = time.perf_counter() + seconds

        async def worker(call):
            nonlocal done
            while time.perf_counter() < stop:
                reply = await call(message)  # a non-zero grpc-status raises
                if not reply:
                    raise LoadError("empty gRPC reply")
                done += 1

        await asyncio.gather(*(worker(calls[i % len(calls)]) for i in range(clients)))
        return done
    except grpc.RpcError as exc:
        raise LoadError(f"gRPC load on {url}: {exc.code().name}: {exc.details()}") from None
    finally:
        for channel in channels:
            await channel.close()


async def _python_http(url: str, payload: bytes, clients: int, seconds: float) -> int:
    host, port = url.rsplit(":", 1)
    stop = time.perf_counter() + seconds
    counts = [0] * clients

    async def worker(i: int) -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            first = True
            while first or time.perf_counter() < stop:
                writer.write(payload)
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"HTTP/1.1 200"):
                    raise LoadError(f"HTTP reply {head[:40]!r}")
                length = 0
                for line in head.split(b"\r\n"):
                    if line[:15].lower() == b"content-length:":
                        length = int(line[15:])
                await reader.readexactly(length)
                if not first:  # the first call per connection warms up
                    counts[i] += 1
                first = False
        finally:
            writer.close()

    await asyncio.gather(*(worker(i) for i in range(clients)))
    return sum(counts)


def _python_run(coroutine) -> tuple[int, float, float]:
    started, cpu = time.perf_counter(), time.process_time()
    done = asyncio.run(coroutine)
    return done, time.perf_counter() - started, time.process_time() - cpu


def http_load(
    url: str, request: HttpRequest, clients: int, seconds: float, generator: str = "auto"
) -> LoadResult:
    """``clients`` concurrent HTTP/1.1 keep-alive clients POSTing ``request`` to ``url``
    (host:port) for about ``seconds``; every reply must have status 200."""
    if resolve(generator) == "native":
        return wrk_http(url, request, clients, seconds)
    done, elapsed, cpu = _python_run(_python_http(url, request.raw(url), clients, seconds))
    return LoadResult("python", done, elapsed, cpu)


def grpc_load(
    url: str,
    message: bytes,
    clients: int,
    seconds: float,
    generator: str = "auto",
    connections: int | None = None,
    method: str = GRPC_INFER,
) -> LoadResult:
    """``clients`` concurrent unary gRPC calls of the serialized ``message`` to ``url`` for
    about ``seconds`` over ``connections`` connections (default: native one per client,
    python one in all, as tritonclient's aio client); every call must succeed."""
    if resolve(generator) == "native":
        return h2load_grpc(url, message, clients, seconds, connections, method)
    run = _python_grpc(url, message, clients, seconds, connections or 1, method)
    done, elapsed, cpu = _python_run(run)
    return LoadResult("python", done, elapsed, cpu)
