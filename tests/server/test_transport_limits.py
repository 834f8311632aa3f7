"""Hostile clients against a real ``tierserve serve`` process: what one client sends can hold
only bounded memory and descriptors, and health keeps answering.

Every case talks to the server over the wire (raw sockets, a raw HTTP/2 client, grpcio,
httpx) and measures the server process itself (its resident memory, its descriptors), so the
cases hold whichever transport serves.
"""

from __future__ import annotations

import collections
import json
import socket
import threading
import time

import grpc
import httpx
import numpy as np
import pytest
from hostile import H2Connection, ServerProcess
from polling import until

from tierserve.server.grpc_gen import grpc_predict_v2_pb2 as pb
from tierserve.server.grpc_native import native_available

pytestmark = pytest.mark.slow
TRANSPORTS = ["native", "python"] if native_available() else ["python"]


def _des_cat(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    des = rng.random((rows, 13), dtype=np.float32)
    return des, rng.integers(0, 5000, (rows, 8)).astype(np.int64)


def _infer_json(rows: int = 2) -> bytes:
    des, cat = _des_cat(rows)
    return json.dumps({"inputs": [
        {"name": "DES", "datatype": "FP32", "shape": [rows, 13], "data": des.ravel().tolist()},
        {"name": "CATCOLUMN", "datatype": "INT64", "shape": [rows, 8], "data": cat.ravel().tolist()},
    ]}).encode()  # fmt: skip


def _grpc_request(rows: int, seed: int = 0) -> bytes:
    des, cat = _des_cat(rows, seed)
    request = pb.ModelInferRequest(model_name="dlrm")
    request.inputs.add(name="DES", datatype="FP32", shape=[rows, 13])
    request.inputs.add(name="CATCOLUMN", datatype="INT64", shape=[rows, 8])
    request.raw_input_contents.extend([des.tobytes(), cat.tobytes()])
    return request.SerializeToString()


def _health_ms(server: ServerProcess, timeout: float = 10.0) -> float:
    """One fresh connection's GET /v2/health/live, in milliseconds (raises unless 200)."""
    started = time.perf_counter()
    r = httpx.get(f"{server.url}/v2/health/live", timeout=timeout)
    assert r.status_code == 200
    return (time.perf_counter() - started) * 1000


def _started(server: ServerProcess) -> ServerProcess:
    assert until(server.ready, timeout=120), server.text()
    return server


def _status_line(sock: socket.socket) -> bytes:
    """The status line of the response on ``sock`` (b"" when it closed without one)."""
    sock.settimeout(10)
    data = b""
    try:
        while b"\r\n" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data.split(b"\r\n", 1)[0]


def _flood(server: ServerProcess, head: bytes, line: bytes, total: int) -> tuple[bytes, int, float]:
    """Send ``head`` then ``line`` over and over (``total`` bytes at most) on one connection,
    sampling the server's memory; its answer's status line, the bytes it took, and the peak
    of its memory above where it started."""
    before, peak, sent = server.rss(), 0.0, 0
    with socket.create_connection(("127.0.0.1", server.http), timeout=10) as sock:
        sock.sendall(head)
        chunk = line * max(1, (256 << 10) // len(line))
        try:
            while sent < total:
                sock.sendall(chunk)
                sent += len(chunk)
                if sent % (8 << 20) < len(chunk):
                    peak = max(peak, server.rss() - before)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed the connection: what it answered is read below
        peak = max(peak, server.rss() - before)
        return _status_line(sock), sent, peak


def test_a_request_head_that_never_ends_is_refused_at_the_limit(tiny_repository):
    """Header lines that never end, one endless header value, an endless URL and too many
    headers: each is refused (431 / 414) once past the limit, holding no memory for what
    follows; the event loop keeps answering health meanwhile."""
    with _started(ServerProcess(tiny_repository())) as server:
        post = b"POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: x\r\n"
        cases = {
            "header lines": (post, b"X-Flood: aaaaaaaaaaaaaaaa\r\n"),
            "header value": (post + b"X-Flood: ", b"a" * 4096),
            "url": (b"GET /v2/" , b"a" * 4096),
        }  # fmt: skip
        probes: list[float] = []
        stop = threading.Event()

        def probe() -> None:
            while not stop.is_set():
                probes.append(_health_ms(server))
                time.sleep(0.02)

        prober = threading.Thread(target=probe)
        prober.start()
        try:
            found = {name: _flood(server, head, line, 256 << 20) for name, (head, line) in cases.items()}
        finally:
            stop.set()
            prober.join()
        for name, (status, sent, peak) in found.items():
            expected = b"HTTP/1.1 414" if name == "url" else b"HTTP/1.1 431"
            assert status.startswith(expected), (name, status, sent)
            assert sent < 64 << 20, (name, sent)  # refused long before the flood ended
            assert peak < 48, (name, peak)  # MiB
        assert max(probes) < 1000, sorted(probes)[-5:]  # ms: the loop never stalled
        # too many header lines, each short; a request within the limits is answered
        many = post + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n"
        with socket.create_connection(("127.0.0.1", server.http), timeout=10) as sock:
            sock.sendall(many)
            assert _status_line(sock).startswith(b"HTTP/1.1 431")
        headers = {f"X-Fine-{i}": "v" * 500 for i in range(90)}  # 90 lines, 46 KB
        r = httpx.post(f"{server.url}/v2/models/dlrm/infer", content=_infer_json(),
                       headers=headers, timeout=30)  # fmt: skip
        assert r.status_code == 200, r.text
        r = httpx.get(f"{server.url}/v2/health/ready", headers={"X-Big": "v" * 70000})
        assert r.status_code == 431 and "max_header_bytes" in r.json()["error"], r.text


def _endless_bodies(server: ServerProcess, connections: int, streams: int, size: int):
    """``connections`` x ``streams`` ModelInfer calls whose messages say ``size`` bytes and
    stop one byte short, sent as fast as the server takes them (until it has taken nothing
    for a second); the connections, their streams, and the server's peak memory above where
    it started (MiB)."""
    before, peak = server.rss(), 0.0
    conns = [H2Connection("127.0.0.1", server.grpc) for _ in range(connections)]
    body = b"\x00" + size.to_bytes(4, "big") + bytes(size - 1)
    opened = [(c, c.open(), 0) for c in conns for _ in range(streams)]
    sent = {(id(c), s): 0 for c, s, _ in opened}
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < 1.0:
        progress = 0
        for conn, stream, _ in opened:
            key = (id(conn), stream)
            n = conn.send(stream, body[sent[key] :])
            sent[key] += n
            progress += n
        for conn in conns:
            conn.pump(0.0 if progress else 0.05)
        if progress:
            idle_since = time.monotonic()
        peak = max(peak, server.rss() - before)
    return conns, [(c, s) for c, s, _ in opened], peak


@pytest.mark.skipif(not native_available(), reason="the native transport is not built")
def test_grpc_bodies_that_never_end_hold_bounded_memory_and_time_out(tiny_repository):
    """Two connections x 150 calls of 8 MiB messages that never end: the server reads no more
    than max_connection_bytes (128 MiB) per connection, refuses the calls that found no room
    within admission_timeout_s (RESOURCE_EXHAUSTED), answers the stalled ones when
    body_timeout_s passes (DEADLINE_EXCEEDED), keeps answering health, and gives the memory
    back."""
    timeout = 12
    args = ("--grpc-transport", "native", "--body-timeout", str(timeout), "--admission-timeout", "2")
    with _started(ServerProcess(tiny_repository(), *args)) as server:
        before = server.rss()
        started = time.monotonic()
        conns, calls, peak = _endless_bodies(server, 2, 150, 8 << 20)
        # no more than 2 x 128 MiB read, plus the HTTP/2 windows (8 MiB a connection)
        assert peak < 2 * 128 + 2 * 8 + 48, peak
        while time.monotonic() - started < timeout - 1:  # health answers meanwhile
            assert _health_ms(server) < 1000
            time.sleep(0.1)
        # every call is answered: RESOURCE_EXHAUSTED (no room in time) or DEADLINE_EXCEEDED
        # (its body stalled; with the connection's window full of what the server does not
        # read, most calls cannot even send their first bytes)
        answers = [c.status(s, timeout + 10) for c, s in calls]
        assert set(answers) <= {"8", "4"}, collections.Counter(answers)
        for conn in conns:
            conn.close()
        assert until(lambda: server.rss() < before * 1.2 + 16, timeout=15), (before, server.rss())
        with grpc.insecure_channel(server.grpc_url) as channel:
            infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            assert pb.ModelInferResponse.FromString(infer(_grpc_request(4), timeout=30)).outputs


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (what it sent before is read and dropped)."""
    sock.settimeout(0)
    try:
        while sock.recv(65536):
            pass
    except BlockingIOError:
        return False
    except OSError:
        pass  # reset
    return True


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_silent_and_idle_grpc_connections_are_closed_and_leave_descriptors(
    tiny_repository, transport
):
    """1,100 gRPC connections that never send the preface, under a limit of 1,024
    descriptors, and 50 that send it and then no call: health, a gRPC channel that was
    already open and the repository poller keep working while they are held (new gRPC
    connections are refused first), and the server closes them all, silent ones after
    header_timeout_s, idle ones after grpc_idle_timeout_s."""
    repo = tiny_repository()
    args = ("--grpc-transport", transport, "--header-timeout", "3", "--grpc-idle-timeout", "4",
            "--poll-interval", "0.5")  # fmt: skip
    with _started(ServerProcess(repo, *args, nofile=1024)) as server:
        channel = grpc.insecure_channel(server.grpc_url)
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        assert infer(_grpc_request(2), timeout=30)
        silent = []
        for _ in range(1100):
            try:
                silent.append(socket.create_connection(("127.0.0.1", server.grpc), timeout=5))
            except OSError:
                break  # refused: the listener's queue is full
        idle = [H2Connection("127.0.0.1", server.grpc) for _ in range(50)]
        for conn in idle:
            conn.pump(0.05)
        flooded = time.monotonic()
        assert server.descriptors() < 1024
        # health, an open channel, and the poller (a new version appears) work meanwhile
        assert _health_ms(server) < 1000
        assert infer(_grpc_request(2), timeout=30)
        _add_version(repo, "2")
        assert until(lambda: _served_version(server) == "2", timeout=30), server.text()
        assert "Too many open files" not in server.text()
        # the server closes them all
        assert until(lambda: all(_closed_by_server(s) for s in silent), timeout=15), (
            sum(map(_closed_by_server, silent)), len(silent), server.descriptors()
        )
        assert time.monotonic() - flooded >= 2  # not before the header timeout
        assert until(lambda: all(c.pump(0.01) is not None and c.closed for c in idle), timeout=15)
        for sock in silent:
            sock.close()
        for conn in idle:
            conn.close()
        assert until(lambda: server.descriptors() < 200, timeout=10), server.descriptors()
        with grpc.insecure_channel(server.grpc_url) as fresh:
            again = fresh.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            assert again(_grpc_request(2), timeout=30)
        channel.close()


def _add_version(repo, version: str) -> None:
    """A copy of version 1 appears, whole, as ``version``."""
    import shutil

    from tierserve.trainer.manifest import MANIFEST

    staging = repo / "dlrm" / f".{version}.tmp"
    shutil.copytree(repo / "dlrm" / "1", staging)
    (staging / MANIFEST).unlink(missing_ok=True)
    staging.rename(repo / "dlrm" / version)


def _served_version(server: ServerProcess) -> str:
    r = httpx.post(f"{server.url}/v2/models/dlrm/infer", content=_infer_json(), timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["model_version"]
