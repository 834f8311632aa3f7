"""The front end as an operator meets it: startup refusals that are one line, slow or silent
connections closed, error bodies without the server's file paths."""

from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import time

import grpc
import httpx
import pytest
from polling import until

from tierserve.core.errors import ConfigError
from tierserve.server.app import BackgroundServer, check_ports, create_app
from tierserve.server.grpc.gen import grpc_predict_v2_pb2 as pb
from tierserve.server.settings import Settings

GOOD = {
    "inputs": [
        {"name": "DES", "datatype": "FP32", "shape": [1, 13], "data": [0.1] * 13},
        {"name": "CATCOLUMN", "datatype": "INT64", "shape": [1, 8], "data": list(range(1, 9))},
    ]
}


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tierserve.clients.cli", "serve", *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
    )  # fmt: skip


def _one_line_refusal(result: subprocess.CompletedProcess, *words: str, lines: int = 1) -> str:
    """The CLI refused with exit status 2 and ``lines`` lines naming ``words``, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    said = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(said) == lines and "Traceback" not in result.stderr, result.stderr
    assert said[0].startswith("tierserve serve: error: "), said
    text = " ".join(said)
    for word in words:
        assert word in text, text
    return text


def test_empty_admin_token_is_refused_at_startup(tiny_repository, monkeypatch):
    repo = tiny_repository()
    for token in ("", "  "):
        with pytest.raises(ConfigError, match="admin_token"):
            Settings.build(model_repository=repo, admin_token=token)
    monkeypatch.setenv("TIERSERVE_ADMIN_TOKEN", "")
    with pytest.raises(ConfigError, match="admin_token"):
        Settings.from_env(model_repository=repo)
    monkeypatch.delenv("TIERSERVE_ADMIN_TOKEN")
    result = _cli("--model-repository", str(repo), "--admin-token", "")
    _one_line_refusal(result, "admin_token", "empty")  # one invalid setting: one line
    result = _cli("--model-repository", str(repo), env={"TIERSERVE_ADMIN_TOKEN": ""})
    _one_line_refusal(result, "admin_token", "empty")


def test_missing_config_or_empty_repository_is_one_line(tmp_path):
    missing = tmp_path / "nope" / "ps.json"
    _one_line_refusal(_cli("--config", str(missing)), "--config", "no such file")
    _one_line_refusal(_cli("--model-repository", str(tmp_path / "nope")), "no such folder")
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "ps.json").write_text(json.dumps({"models": []}))
    _one_line_refusal(_cli("--model-repository", str(empty)), "holds no model")
    with pytest.raises(ConfigError, match="holds no model"):
        create_app(Settings.build(model_repository=empty))


def test_a_port_in_use_is_one_line(tiny_repository):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--http-port {port}.*in use"):
            check_ports(Settings.build(http_port=port, grpc_port=None))
        with pytest.raises(ConfigError, match=f"--grpc-port {port}"):
            check_ports(Settings.build(http_port=0, grpc_port=port))
        result = _cli("--model-repository", str(tiny_repository()), "--http-port", str(port),
                      "--grpc-port", "0", "--no-malloc-tuning")  # fmt: skip
        _one_line_refusal(result, f"--http-port {port}", "in use")


def test_error_bodies_do_not_reveal_file_paths(tiny_repository, caplog):
    repo = tiny_repository()
    (repo / "broken" / "1").mkdir(parents=True)  # a version folder without its files
    config = json.loads((repo / "ps.json").read_text())
    config["models"].append(dict(config["models"][0], model="broken"))
    (repo / "ps.json").write_text(json.dumps(config))
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=0, poll_interval_s=0)
    secret = str(repo.parent)
    with BackgroundServer(settings) as server:
        url = f"http://{server.http_url}"
        answers = [
            httpx.post(f"{url}/v2/repository/models/broken/load"),
            httpx.post(f"{url}/v2/models/broken/infer", json=GOOD),
            httpx.get(f"{url}/v2/models/broken"),
            httpx.post(f"{url}/v2/repository/index"),
        ]
        assert answers[0].status_code >= 400 and answers[1].status_code >= 400
        for r in answers:
            assert secret not in r.text, r.text
            assert "/" not in r.text.replace(".../", "") or r.status_code == 200, r.text
        reason = [m for m in answers[3].json() if m["name"] == "broken"][0]["reason"]
        assert reason and ".../" in reason and secret not in reason
        with grpc.insecure_channel(server.grpc_url) as channel:
            infer = channel.unary_unary(
                "/inference.GRPCInferenceService/ModelInfer",
                request_serializer=pb.ModelInferRequest.SerializeToString,
                response_deserializer=pb.ModelInferResponse.FromString,
            )
            with pytest.raises(grpc.RpcError) as err:
                infer(pb.ModelInferRequest(model_name="broken"))
            assert secret not in err.value.details()
    assert any(secret in r.getMessage() for r in caplog.records)  # the log keeps the path


def _slow_clients(address: tuple[str, int], count: int) -> list[socket.socket]:
    """``count`` connections: silent ones, ones stuck in their headers, ones stuck in their
    body."""
    socks = []
    for i in range(count):
        s = socket.create_connection(address, timeout=5)
        if i % 3 == 1:
            s.sendall(b"POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        elif i % 3 == 2:
            s.sendall(b"POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"inputs\": [")  # fmt: skip
        socks.append(s)
    return socks


def _readable(socks: list[socket.socket]) -> bool:
    """Whether any of ``socks`` has something to read (or was closed), without waiting; by
    poll, as select() refuses descriptors over 1,023 (a long test session holds many)."""
    poller = select.poll()
    for s in socks:
        poller.register(s, select.POLLIN)
    return bool(poller.poll(0))


def _closed_by_server(s: socket.socket) -> bool:
    s.settimeout(0.01)
    try:
        return s.recv(1024) == b""
    except TimeoutError:
        return False
    except OSError:  # reset
        return True


def test_slow_and_silent_connections_are_closed_and_good_requests_answer(tiny_repository):
    settings = Settings.build(
        model_repository=tiny_repository(), http_port=0, grpc_port=None, poll_interval_s=0,
        header_timeout_s=3.0, body_timeout_s=3.0,
    )  # fmt: skip
    with BackgroundServer(settings) as server:
        host, port = server.http_url.split(":")
        socks = _slow_clients((host, int(port)), 300)
        try:
            r = httpx.post(f"http://{server.http_url}/v2/models/dlrm/infer", json=GOOD, timeout=5)
            # answered while the slow connections are held, not once their timeouts freed them
            assert r.status_code == 200 and not _readable(socks)
            assert until(lambda: all(_closed_by_server(s) for s in socks), timeout=30)
            # a kept-alive connection that starts a request and stalls is closed too
            with socket.create_connection((host, int(port)), timeout=5) as s:
                body = json.dumps(GOOD).encode()
                s.sendall(b"POST /v2/models/dlrm/infer HTTP/1.1\r\nHost: x\r\nContent-Length: "
                          + str(len(body)).encode() + b"\r\n\r\n" + body)  # fmt: skip
                assert b"200 OK" in s.recv(65536)
                s.sendall(b"GET /v2/health/live HTTP/1.1\r\nHo")
                assert until(lambda: _closed_by_server(s), timeout=5)
        finally:
            for s in socks:
                s.close()
        # a good request that takes its time within the limits still answers
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(b"GET /v2/health/live HTTP/1.1\r\n")
            time.sleep(0.5)  # the client's pause is the behaviour: well within the 3 s limits
            s.sendall(b"Host: x\r\n\r\n")
            assert s.recv(1024).startswith(b"HTTP/1.1 200")


def test_the_cli_has_the_settings():
    from tierserve.clients.cli import build_parser
    from tierserve.clients.serve import settings_from_args

    args = build_parser().parse_args([
        "serve", "--model-repository", "r", "--max-keys-per-request", "100",
        "--max-keys-per-row", "7", "--allow-nonfinite-inputs", "--header-timeout", "3",
        "--body-timeout", "4",
    ])  # fmt: skip
    settings = settings_from_args(args)
    assert (settings.max_keys_per_request, settings.max_keys_per_row) == (100, 7)
    assert settings.allow_nonfinite_inputs
    assert (settings.header_timeout_s, settings.body_timeout_s) == (3.0, 4.0)
