"""``tierserve doctor``: what the machine has, and which services of a ps.json answer (a real
Redis from the test services; an address where nothing listens)."""

from __future__ import annotations

import json
import re
import socket

import pytest

from tierserve.cache.device import cupy_or_none
from tierserve.clients.cli import main
from tierserve.clients.doctor import diagnose


def closed_port() -> int:
    """A loopback port where nothing listens (bound a moment ago, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def write_ps(tmp_path, volatile: dict, update_source: dict | None = None):
    path = tmp_path / "ps.json"
    ps = {"volatile_db": volatile, "models": []}
    if update_source:
        ps["update_source"] = update_source
    path.write_text(json.dumps(ps))
    return path


def test_without_a_gpu_it_says_so_and_exits_0(capsys):
    if cupy_or_none() is not None:
        pytest.skip("this machine has a GPU")
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\[missing\] devices: .*CPU \(numpy\)", out), out
    assert re.search(r"\[(missing|ok)\] cupy: ", out)
    # the kernels are still checked, with NVRTC (a dev dependency)
    assert re.search(r"\[ok\] NVRTC 12\.\d+: embedding_cache\.cu compiled for .*sm_80.*sm_90", out)
    for extra in ("gpu", "redis", "kafka", "rocksdb", "triton", "parquet"):
        assert re.search(rf"\[(ok|missing)\] {extra}: ", out), extra
    assert "[ok] redis: redis " in out  # the dev environment installs the redis extra


def test_every_extra_of_pyproject_and_the_native_transport_are_reported():
    """The report covers every extra the installed package offers (bar "all"), and says
    whether gRPC goes over the native transport."""
    import importlib.metadata

    from tierserve.server.grpc.native import native_available

    offered = set(importlib.metadata.metadata("tierserve").get_all("Provides-Extra"))
    checks = {c.name: c for c in diagnose(compile_kernels=False) if c.section == "extras"}
    assert offered - {"all"} <= set(checks), offered - set(checks)
    native = checks["native gRPC transport"]
    assert native.status == ("ok" if native_available() else "missing")
    assert ("Rust" if native_available() else "grpc.aio") in native.detail


def test_a_real_redis_answers_and_a_closed_port_does_not(tmp_path, redis_server, capsys):
    config = write_ps(tmp_path, {"type": "redis", "address": f"{redis_server.host}:{redis_server.port}"})
    assert main(["doctor", "--no-compile", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"\[ok\] redis {redis_server.host}:{redis_server.port}: answering \(Redis \d", out), out

    port = closed_port()
    broker = closed_port()
    config = write_ps(
        tmp_path, {"type": "redis", "address": f"127.0.0.1:{port}"},
        {"type": "kafka_message_queue", "brokers": f"127.0.0.1:{broker}"},
    )
    assert main(["doctor", "--no-compile", "--timeout", "0.5", "--config", str(config)]) == 1
    out = capsys.readouterr().out
    assert re.search(rf"\[fail\] redis 127\.0\.0\.1:{port}: not answering within 0\.5s", out), out
    assert re.search(rf"\[fail\] kafka 127\.0\.0\.1:{broker}: not answering within 0\.5s", out), out


def test_every_cluster_node_is_asked(tmp_path, redis_cluster):
    addresses = redis_cluster.nodes
    down = f"127.0.0.1:{closed_port()}"
    config = write_ps(tmp_path, {"type": "redis_cluster", "address": ",".join([*addresses, down])})
    checks = {c.name: c for c in diagnose(str(config), timeout=0.5, compile_kernels=False)}
    for address in addresses:
        c = checks[f"redis_cluster {address}"]
        assert c.status == "ok" and "cluster_state ok" in c.detail, c
    assert checks[f"redis_cluster {down}"].status == "fail"


def test_a_bad_ps_json_is_a_failed_check_naming_the_field(tmp_path, capsys):
    config = write_ps(tmp_path, {"type": "redis", "adress": "x:1"})
    assert main(["doctor", "--no-compile", "--json", "--config", str(config)]) == 1
    checks = json.loads(capsys.readouterr().out)
    bad = [c for c in checks if c["status"] == "fail"]
    assert len(bad) == 1 and "adress: unknown field" in bad[0]["detail"]


def test_the_timeout_must_be_positive(capsys):
    assert main(["doctor", "--timeout", "0"]) == 2
    assert "--timeout must be positive" in capsys.readouterr().err


def test_a_real_kafka_broker_answers(tmp_path, kafka_broker):
    config = write_ps(tmp_path, {"type": "hash_map"},
                      {"type": "kafka_message_queue", "brokers": kafka_broker.bootstrap})
    checks = {c.name: c for c in diagnose(str(config), timeout=5, compile_kernels=False)}
    c = checks[f"kafka {kafka_broker.bootstrap}"]
    assert c.status == "ok" and re.match(r"answering: 1 broker\(s\), \d+ topics", c.detail), c
    assert checks["volatile_db hash_map"].status == "info"
