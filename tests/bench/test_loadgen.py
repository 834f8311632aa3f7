"""bench/server/loadgen.py, the serving benchmarks' load generator: it counts the replies of
real servers, and a run where some replies fail (HTTP status other than 200, gRPC status other
than OK) raises instead of reporting a rate, for the native tools (wrk, h2load) and the Python
fallback alike."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from services.install import ensure_command

from bench.server import loadgen
from tierserve.server.app import free_port

REPLY = b"\n\x04dlrm\x12\x011"  # a ModelInferResponse naming the model
METHOD = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module", autouse=True)
def native_tools() -> None:
    ensure_command("wrk", "wrk")
    ensure_command("h2load", "nghttp2-client")


class HttpServer:
    """An HTTP/1.1 keep-alive server on a thread of its own: answers 200 with a small body,
    or 503 to every ``fail_every``-th request when set."""

    def __init__(self, fail_every: int = 0) -> None:
        self.port = free_port()
        self.fail_every = fail_every
        self.count = itertools.count(1)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _handle(self, reader, writer) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                n = next(self.count)
                status = (
                    b"503 Service Unavailable"
                    if self.fail_every and n % self.fail_every == 0
                    else b"200 OK"
                )
                writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n\r\nok")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def __enter__(self) -> HttpServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", self.port), self.loop
        ).result(10)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def grpc_server(fail_every: int = 0) -> Iterator[tuple[str, itertools.count]]:
    """A grpcio server answering ModelInfer with :data:`REPLY`, or UNAVAILABLE to every
    ``fail_every``-th call after the first when set."""
    calls = itertools.count(1)

    def infer(request: bytes, context) -> bytes:
        n = next(calls)
        if fail_every and n > 1 and n % fail_every == 0:
            context.abort(grpc.StatusCode.UNAVAILABLE, "made to fail")
        return REPLY

    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {"ModelInfer": grpc.unary_unary_rpc_method_handler(infer)},
    )
    from concurrent.futures import ThreadPoolExecutor

    server = grpc.server(ThreadPoolExecutor(8))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", calls
    finally:
        server.stop(0)


REQUEST = loadgen.HttpRequest("/v2/models/dlrm/infer", {"Content-Type": "application/json"}, b"{}")


@pytest.mark.parametrize("generator", ["native", "python"])
def test_http_load_counts_the_replies_it_got(generator):
    with HttpServer() as server:
        result = loadgen.http_load(f"127.0.0.1:{server.port}", REQUEST, 8, 1, generator)
        answered = next(server.count) - 1
    assert result.requests > 50
    # every counted request was answered; the server also saw the ones cut off at the end
    # (and the python generator's uncounted first call per connection)
    assert result.requests <= answered <= result.requests + 2 * 8
    assert 0.9 <= result.seconds <= 1.5
    assert 0 < result.cpu_s < result.seconds * 2


@pytest.mark.parametrize("generator", ["native", "python"])
def test_http_load_fails_on_a_reply_that_is_not_200(generator):
    with HttpServer(fail_every=50) as server, pytest.raises(loadgen.LoadError, match="503|not_200"):
        loadgen.http_load(f"127.0.0.1:{server.port}", REQUEST, 8, 1, generator)


@pytest.mark.parametrize("generator", ["native", "python"])
def test_grpc_load_counts_the_calls_it_got(generator):
    for url, calls in grpc_server():
        result = loadgen.grpc_load(url, b"\x0a\x04dlrm", 8, 1, generator, connections=2)
        answered = next(calls) - 1
    assert result.requests > 50
    assert result.requests <= answered <= result.requests + 8 + 2 + 1
    if generator == "native":
        assert result.details["data_bytes"] >= result.requests * (5 + len(REPLY))


@pytest.mark.parametrize("generator", ["native", "python"])
def test_grpc_load_fails_on_a_non_zero_grpc_status(generator):
    # HTTP status 200 on every call; only the trailers (or their absence of data) tell
    for url, _ in grpc_server(fail_every=40):
        with pytest.raises(loadgen.LoadError, match="UNAVAILABLE|grpc-status"):
            loadgen.grpc_load(url, b"\x0a\x04dlrm", 8, 1, generator, connections=2)


def test_native_is_refused_with_the_install_command_when_missing(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(loadgen.LoadError, match="install_loadgen.sh"):
        loadgen.resolve("native")
    assert loadgen.resolve("auto") == "python"
    with pytest.raises(ValueError, match="--loadgen"):
        loadgen.resolve("wrk2")


def test_the_install_script_does_nothing_when_the_tools_are_there():
    script = Path(__file__).resolve().parents[2] / "bench/server/install_loadgen.sh"
    done = subprocess.run(["sh", str(script)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
