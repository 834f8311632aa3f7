"""SIGTERM drains: every request a client had sent before the signal is answered, over HTTP
and gRPC, with one worker and with two, and the server exits 0 either way."""

from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import numpy as np
import pytest
from hostile import H2Connection, ServerProcess
from polling import until

from tierserve.server.grpc.gen import grpc_predict_v2_pb2 as pb

pytestmark = pytest.mark.slow


def _hash_map_only(repo):
    """The repository with its tables in a hash map alone (shareable by two workers)."""
    config = json.loads((repo / "ps.json").read_text())
    config.pop("persistent_db", None)
    config["volatile_db"] = {"type": "hash_map"}
    (repo / "ps.json").write_text(json.dumps(config))
    return repo


def _http_request(rows: int) -> bytes:
    rng = np.random.default_rng(rows)
    body = json.dumps({"inputs": [
        {"name": "DES", "datatype": "FP32", "shape": [rows, 13], "data": rng.random(rows * 13).tolist()},
        {"name": "CATCOLUMN", "datatype": "INT64", "shape": [rows, 8],
         "data": rng.integers(0, 5000, rows * 8).tolist()},
    ]}).encode()  # fmt: skip
    return (b"POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body  # fmt: skip


def _grpc_message(rows: int) -> bytes:
    rng = np.random.default_rng(rows)
    request = pb.ModelInferRequest(model_name="dlrm")
    request.inputs.add(name="DES", datatype="FP32", shape=[rows, 13])
    request.inputs.add(name="CATCOLUMN", datatype="INT64", shape=[rows, 8])
    request.raw_input_contents.extend([
        rng.random((rows, 13), dtype=np.float32).tobytes(),
        rng.integers(0, 5000, (rows, 8)).astype(np.int64).tobytes(),
    ])  # fmt: skip
    message = request.SerializeToString()
    return b"\x00" + len(message).to_bytes(4, "big") + message


def _answer(sock: socket.socket) -> bytes:
    """The whole HTTP response on ``sock`` (the server closes the connection after it)."""
    sock.settimeout(60)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return data


def _serving(server: ServerProcess, workers: int) -> list[int]:
    """The processes that serve: the server itself, or its worker processes."""
    if workers == 1:
        return [server.proc.pid]
    children = Path(f"/proc/{server.proc.pid}/task/{server.proc.pid}/children").read_text()
    return [int(pid) for pid in children.split()
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]  # fmt: skip


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_answers_every_request_already_sent(tiny_repository, workers):
    """The serving processes are stopped (SIGSTOP) while 40 HTTP requests, each on a new
    connection, and 40 gRPC calls are sent whole: they wait in the kernel (accept queues,
    socket buffers), as requests do that arrive just before a SIGTERM.  Then SIGTERM, and
    the processes go on: every one of them is answered, and the server exits 0."""
    repo = _hash_map_only(tiny_repository())
    server = ServerProcess(repo, "--workers", str(workers), "--shutdown-grace", "20")
    with server:
        assert until(server.ready, timeout=120), server.text()
        assert until(lambda: len(_serving(server, workers)) == workers, timeout=30)
        grpc_conns = [H2Connection("127.0.0.1", server.grpc) for _ in range(4)]
        for conn in grpc_conns:
            conn.pump(1.0)  # the server's settings: its windows
        serving = _serving(server, workers)
        for pid in serving:
            os.kill(pid, signal.SIGSTOP)
        try:
            http = [socket.create_connection(("127.0.0.1", server.http)) for _ in range(40)]
            for i, sock in enumerate(http):
                sock.sendall(_http_request(1 + i % 8))
            calls = []
            for i in range(40):
                conn = grpc_conns[i % 4]
                stream = conn.open()
                message = _grpc_message(1 + i % 8)
                assert conn.send(stream, message, end=True) == len(message)
                calls.append((conn, stream))
            server.proc.send_signal(signal.SIGTERM)
        finally:
            for pid in serving:
                os.kill(pid, signal.SIGCONT)
        answers = [_answer(sock).split(b"\r\n", 1)[0] for sock in http]
        statuses = [conn.status(stream, 60) for conn, stream in calls]
        for sock in http:
            sock.close()
        for conn in grpc_conns:
            conn.close()
        assert answers == [b"HTTP/1.1 200 OK"] * 40, answers
        assert statuses == ["0"] * 40, statuses
        assert server.proc.wait(timeout=60) == 0, server.text()[-3000:]
