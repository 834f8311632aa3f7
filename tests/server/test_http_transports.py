"""Infer requests over both HTTP transports (python: uvicorn; native: parsed and decoded
in Rust, see server/http/native.py), each answered as the app's own infer route answers it.

The answers are compared on one real server with the app's own infer route: a path with a
percent escape (``/v2/models/%6D/infer``, the model ``m``) is left to the ASGI app (the
native transport takes only plain infer paths), which unquotes it and serves it through
``InferFastPath``, so the same request reaches both implementations.  The HTTP edge cases (pipelining, keep-alive, chunked bodies, Expect:
100-continue, oversize bodies, malformed headers, connection close) run over real sockets.
"""

from __future__ import annotations

import gzip
import json
import socket

import numpy as np
import pytest
from doubler_model import binary_body, doubler_loader, write_doubler_repository
from polling import until

from tierserve.server.app import BackgroundServer
from tierserve.server.settings import Settings

pytestmark = pytest.mark.usefixtures("each_http_transport")

HEADER = "inference-header-content-length"
LIMIT = 4096


@pytest.fixture
def repo(tmp_path):
    return write_doubler_repository(tmp_path)


@pytest.fixture
def server(repo):
    settings = Settings.build(
        model_repository=repo, http_port=0, grpc_port=None, poll_interval_s=0,
        max_request_bytes=LIMIT,
    )  # fmt: skip
    with BackgroundServer(settings, loader=doubler_loader) as running:
        yield running


def _json_body(des, cat, request_id="r1") -> bytes:
    return json.dumps({
        "id": request_id,
        "inputs": [
            {"name": "DES", "datatype": "FP32", "shape": list(des.shape),
             "data": des.ravel().tolist()},
            {"name": "CATCOLUMN", "datatype": "INT64", "shape": list(cat.shape),
             "data": cat.tolist()},
        ],
    }).encode()  # fmt: skip


DES = np.arange(6, dtype=np.float32).reshape(2, 3)
CAT = np.array([[1, 2], [3, 4]], dtype=np.int64)
EXPECTED = [9.0, 31.0]  # 2 * (0+1+2) + 3, 2 * (3+4+5) + 7


def _request(path: str, body: bytes, headers: dict | None = None, extra: bytes = b"") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    for name, value in (headers or {}).items():
        head += f"{name}: {value}\r\n"
    return head.encode() + extra + b"\r\n" + body


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)

    def outputs(self) -> list[float]:
        if HEADER in self.headers:
            return np.frombuffer(self.body[int(self.headers[HEADER]) :], np.float32).tolist()
        return self.json()["outputs"][0]["data"]


def _read(stream, versions: tuple[bytes, ...] = (b"HTTP/1.1 ",)) -> Response:
    """One response (Content-Length framed) from a socket's file, its status line of one of
    ``versions``."""
    status_line = stream.readline()
    assert status_line.startswith(versions), status_line
    headers = {}
    while True:
        line = stream.readline()
        if line in (b"\r\n", b""):
            break
        name, value = line.decode("latin-1").split(":", 1)
        headers[name.strip().lower()] = value.strip()
    body = stream.read(int(headers.get("content-length", 0)))
    return Response(int(status_line.split()[1]), headers, body)


def _connect(server: BackgroundServer) -> socket.socket:
    host, port = server.http_url.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _exchange(server, *requests: bytes) -> list[Response]:
    """The responses to ``requests``, sent one after another on one connection."""
    with _connect(server) as s, s.makefile("rb") as stream:
        out = []
        for request in requests:
            s.sendall(request)
            out.append(_read(stream))
        return out


def _closed(s: socket.socket) -> bool:
    s.settimeout(5)
    try:
        return s.recv(1) == b""
    except OSError:
        return True


# --- same answers as the app's route ---------------------------------------------------------


def _cases() -> dict[str, tuple[str, bytes, dict]]:
    """name: (path after /v2/models/{m}, body, headers)."""
    json_body = _json_body(DES, CAT)
    binary, header_length = binary_body(DES, CAT)
    hl = {HEADER: str(header_length)}
    return {
        "json": ("/infer", json_body, {}),
        "versioned": ("/versions/1/infer", json_body, {}),
        "query string": ("/infer?x=1", json_body, {}),
        "binary": ("/infer", binary, {**hl, "Content-Type": "application/octet-stream"}),
        "gzip": ("/infer", gzip.compress(json_body), {"Content-Encoding": "gzip"}),
        "unknown version": ("/versions/7/infer", json_body, {}),
        "bad json": ("/infer", b'{"inputs": [', {}),
        "bad header length": ("/infer", binary, {HEADER: "x"}),
        "header length past body": ("/infer", binary, {HEADER: "100000"}),
        "truncated": ("/infer", binary[:-3], hl),
        "bad encoding": ("/infer", json_body, {"Content-Encoding": "br"}),
        "bad gzip": ("/infer", b"not gzip", {"Content-Encoding": "gzip"}),
        "too large": ("/infer", b"x" * (LIMIT + 1), {}),
        "wrong shape": ("/infer", json_body.replace(b"[2, 2]", b"[1, 4]"), {}),
        "no inputs": ("/infer", b'{"inputs": []}', {}),
    }


def test_answers_are_the_app_routes(server):
    expected_status = {
        "json": 200, "versioned": 200, "query string": 200, "binary": 200, "gzip": 200,
        "unknown version": 404, "bad json": 400, "bad header length": 400,
        "header length past body": 400, "truncated": 400, "bad encoding": 400,
        "bad gzip": 400, "too large": 413, "wrong shape": 400, "no inputs": 400,
    }  # fmt: skip
    for name, (tail, body, headers) in _cases().items():
        here, app = _exchange(
            server,
            _request("/v2/models/m" + tail, body, headers),
            _request("/v2/models/%6D" + tail, body, headers),  # left to the ASGI app
        )
        assert here.status == expected_status[name], (name, here.body)
        assert (here.status, here.body) == (app.status, app.body), name
        for header in ("content-type", HEADER, "connection", "server"):
            assert here.headers.get(header) == app.headers.get(header), (name, header)
        if here.status == 200:
            assert here.outputs() == EXPECTED, name
        else:
            assert here.json()["error"], name
    unknown = _exchange(server, _request("/v2/models/nope/infer", _json_body(DES, CAT)))[0]
    assert unknown.status == 404 and "nope" in unknown.json()["error"]
    metrics = _exchange(server, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")[0].body.decode()
    # every request counted once, whichever implementation answered it
    count = sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("tierserve_requests_total{") and 'protocol="http"' in line
    )
    assert count == 2 * len(expected_status) + 1


# --- HTTP edge cases over real sockets -------------------------------------------------------


def test_pipelined_requests_answer_in_order_on_one_kept_alive_connection(server):
    rows = [np.full((1, 3), i, np.float32) for i in range(3)]
    keys = [np.full((1, 2), i, np.int64) for i in range(3)]
    infer = [_request("/v2/models/m/infer", _json_body(d, k, f"r{i}")) for i, (d, k) in
             enumerate(zip(rows, keys))]  # fmt: skip
    live = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    bad = _request("/v2/models/m/infer", b"{")
    with _connect(server) as s, s.makefile("rb") as stream:
        s.sendall(infer[0] + live + infer[1] + bad + infer[2])  # one write: all pipelined
        answers = [_read(stream) for _ in range(5)]
        # and the connection stays open for more
        s.sendall(infer[1])
        again = _read(stream)
    assert [a.status for a in answers] == [200, 200, 200, 400, 200]
    assert [answers[i].json()["id"] for i in (0, 2, 4)] == ["r0", "r1", "r2"]
    assert [answers[i].outputs() for i in (0, 2, 4)] == [[8.0 * i] for i in range(3)]
    assert again.status == 200 and again.outputs() == [8.0]


def test_chunked_body(server):
    body = _json_body(DES, CAT)
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i : i + 50]), body[i : i + 50])
                      for i in range(0, len(body), 50))  # fmt: skip
    request = (
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + chunks + b"0\r\n\r\n"
    )  # fmt: skip
    answer, after = _exchange(server, request, _request("/v2/models/m/infer", body))
    assert answer.status == 200 and answer.outputs() == EXPECTED
    assert after.status == 200


def test_expect_100_continue(server):
    body = _json_body(DES, CAT)
    head = (
        f"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        "Expect: 100-continue\r\n\r\n"
    ).encode()
    with _connect(server) as s, s.makefile("rb") as stream:
        s.sendall(head)
        assert stream.readline() == b"HTTP/1.1 100 Continue\r\n"
        assert stream.readline() == b"\r\n"
        s.sendall(body)
        answer = _read(stream)
    assert answer.status == 200 and answer.outputs() == EXPECTED
    # refused before its body: no 100, the error at once
    with _connect(server) as s, s.makefile("rb") as stream:
        s.sendall(head.replace(b"/m/", b"/nope/"))
        refused = _read(stream)
    assert refused.status == 404


def test_oversize_bodies_are_refused_and_the_connection_goes_on(server):
    big = b"x" * (LIMIT + 100)
    declared = _request("/v2/models/m/infer", big)
    chunked = (
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%s\r\n" % (1000, big[:1000]) for _ in range(5)) + b"0\r\n\r\n"
    )  # fmt: skip
    good = _request("/v2/models/m/infer", _json_body(DES, CAT))
    answers = _exchange(server, declared, good, chunked, good)
    assert [a.status for a in answers] == [413, 200, 413, 200]
    assert str(LIMIT) in answers[2].json()["error"]
    assert answers[3].outputs() == EXPECTED


def test_malformed_requests_get_400_and_close(server):
    for request in (
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
        b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    ):
        with _connect(server) as s, s.makefile("rb") as stream:
            s.sendall(request)
            answer = _read(stream)
            assert answer.status == 400, request
            assert _closed(s)
    assert _exchange(server, _request("/v2/models/m/infer", _json_body(DES, CAT)))[0].status == 200


def test_connection_close_and_http_10(server):
    body = _json_body(DES, CAT)
    for request in (
        _request("/v2/models/m/infer", body, {"Connection": "close"}),
        _request("/v2/models/m/infer", body).replace(b"HTTP/1.1", b"HTTP/1.0", 1),
    ):
        with _connect(server) as s, s.makefile("rb") as stream:
            s.sendall(request)
            # an HTTP/1.0 client may be answered in HTTP/1.0 (hyper) or 1.1 (h11)
            answer = _read(stream, (b"HTTP/1.1 ", b"HTTP/1.0 "))
            assert answer.status == 200 and answer.outputs() == EXPECTED
            assert answer.headers.get("connection") == "close"
            assert _closed(s)


def test_a_client_gone_before_its_body_is_counted_499(server):
    body = _json_body(DES, CAT)
    with _connect(server) as s:
        s.sendall(_request("/v2/models/m/infer", body)[: -len(body) // 2])
    assert until(
        lambda: b'protocol="http",status="499"' in server.plane.metrics.render(), timeout=10
    )
    assert _exchange(server, _request("/v2/models/m/infer", body))[0].status == 200


def test_predict_takes_a_version_beyond_64_bits(server):
    """A JSON integer too large for orjson (read as a float) is still an integer version:
    no such version (404), not a malformed request (found by tests/server/test_fuzz.py)."""
    for version, status in ((2**70, 404), (-(2**70), 404), (1.5, 400), (1.0, 400)):
        body = json.dumps({"model": "m", "version": version, "inputs": {}}).encode()
        answer = _exchange(server, _request("/predict", body))[0]
        assert answer.status == status, (version, answer.body)
        if status == 404:
            assert str(version) in answer.json()["error"]


# --- deadlines and clients that leave ------------------------------------------------------


def test_deadlines_close_idle_and_stalled_connections_and_spare_busy_ones(tiny_repository):
    """Keep-alive, header and body deadlines (one sweep per loop, no timer per request)."""
    import socket
    import time

    from polling import until

    from tierserve.server.app import BackgroundServer
    from tierserve.server.settings import Settings

    def closed(s: socket.socket) -> bool:
        timeout = s.gettimeout()
        s.settimeout(0.01)
        try:
            return s.recv(1024) == b""
        except TimeoutError:
            return False
        except OSError:
            return True
        finally:
            s.settimeout(timeout)  # the next recv waits as long as before, not 10 ms

    settings = Settings.build(
        model_repository=tiny_repository(), http_port=0, grpc_port=None, poll_interval_s=0,
        header_timeout_s=0.6, body_timeout_s=0.6, keep_alive_timeout_s=0.4,
    )  # fmt: skip
    live = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    with BackgroundServer(settings) as server:
        address = server.http_url.split(":")[0], int(server.http_url.split(":")[1])
        with (
            socket.create_connection(address, timeout=5) as idle,
            socket.create_connection(address, timeout=5) as busy,
            socket.create_connection(address, timeout=5) as body,
        ):
            started = time.perf_counter()
            for s in (idle, busy):
                s.sendall(live)
                assert s.recv(1024).startswith(b"HTTP/1.1 200")
            body.sendall(
                b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n{"
            )
            # a connection that keeps asking stays open past every timeout
            while time.perf_counter() - started < 1.2:
                busy.sendall(live)
                assert busy.recv(1024).startswith(b"HTTP/1.1 200")
                time.sleep(0.1)
            assert until(lambda: closed(idle), timeout=3)
            assert until(lambda: closed(body), timeout=3)
            assert not closed(busy)
            busy.sendall(live)
            assert busy.recv(1024).startswith(b"HTTP/1.1 200")


def test_a_batched_request_whose_client_hung_up_does_not_run(tmp_path):
    """A request queued behind a running batch whose client closes its connection is
    dropped before it runs (counted as a 499), and the server goes on answering."""
    import socket
    import threading
    import time
    import urllib.request

    import numpy as np
    from doubler_model import Doubler, binary_body, write_doubler_repository
    from prometheus_client.parser import text_string_to_metric_families

    from tierserve.server.app import BackgroundServer
    from tierserve.server.runtime.servables import RankingServable
    from tierserve.server.settings import Settings

    class Gate(Doubler):
        running = threading.Event()
        rows: list[int] = []

        def predict_batch(self, batch):
            self.rows.append(batch.batch_size)
            self.running.set()
            time.sleep(0.6)
            return super().predict_batch(batch)

    def request(rows: int) -> bytes:
        body, header_length = binary_body(
            np.ones((rows, 3), np.float32), np.ones((rows, 2), np.int64)
        )
        return (
            b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
            b"Inference-Header-Content-Length: %d\r\n\r\n" % (len(body), header_length)
        ) + body

    def status(s: socket.socket) -> bytes:
        return s.recv(65536).split(b"\r\n", 1)[0]

    model = Gate()
    settings = Settings.build(
        model_repository=write_doubler_repository(tmp_path), http_port=0, grpc_port=None,
        poll_interval_s=0,
    )  # fmt: skip
    loader = lambda n, v, d, c: RankingServable(n, v, model)  # noqa: E731
    with BackgroundServer(settings, loader) as server:
        address = server.http_url.split(":")[0], int(server.http_url.split(":")[1])
        with socket.create_connection(address, timeout=10) as first:
            first.sendall(request(16))  # a whole batch: it runs alone
            assert model.running.wait(10)
            with socket.create_connection(address, timeout=10) as gone:
                gone.sendall(request(2))  # queued behind the first ...
            # ... and its client gone before that batch is done
            assert status(first) == b"HTTP/1.1 200 OK"
        with socket.create_connection(address, timeout=10) as after:
            after.sendall(request(4))
            assert status(after) == b"HTTP/1.1 200 OK"
        metrics = urllib.request.urlopen(f"http://{server.http_url}/metrics", timeout=10).read()
    assert model.rows == [16, 4]
    hung_up = [
        s.value for f in text_string_to_metric_families(metrics.decode())
        for s in f.samples
        if s.name == "tierserve_request_errors_total" and s.labels.get("status") == "499"
    ]  # fmt: skip
    assert hung_up == [1.0]
