"""docker-compose.yml and deploy/ agree with each other (Docker cannot run here).

The compose file keeps to a YAML subset (block mappings and lists, JSON-style flow lists,
plain or quoted scalars), read by the small reader below so no YAML package is needed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tierserve.ps.config import load_ps_config

ROOT = Path(__file__).resolve().parents[2]


def _scalar(text: str):
    text = text.strip()
    if text.startswith("["):
        return json.loads(text)
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


def parse_yaml_subset(text: str):
    """Block-style YAML (the subset docker-compose.yml uses) as dicts, lists and strings."""
    lines = []
    for raw in text.splitlines():
        stripped = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        if stripped.strip():
            lines.append((len(stripped) - len(stripped.lstrip()), stripped.strip()))

    def block(i: int, indent: int):
        if lines[i][1].startswith("- "):
            out = []
            while i < len(lines) and lines[i][0] == indent and lines[i][1].startswith("- "):
                out.append(_scalar(lines[i][1][2:]))
                i += 1
            return out, i
        out = {}
        while i < len(lines) and lines[i][0] == indent:
            key, _, value = lines[i][1].partition(":")
            i += 1
            if value.strip():
                out[key.strip()] = _scalar(value)
            elif i < len(lines) and lines[i][0] > indent:
                out[key.strip()], i = block(i, lines[i][0])
            else:
                out[key.strip()] = None
        return out, i

    doc, end = block(0, lines[0][0])
    assert end == len(lines), f"unparsed line: {lines[end]}"
    return doc


@pytest.fixture(scope="module")
def compose():
    return parse_yaml_subset((ROOT / "docker-compose.yml").read_text())


def test_services_exist(compose):
    services = compose["services"]
    assert {"tierserve", "redis-node-1", "redis-node-2", "redis-node-3", "redis-cluster-init",
            "kafka", "tritonserver"} <= set(services)  # fmt: skip
    assert services["tritonserver"]["profiles"] == ["triton"]
    assert services["redis-cluster-init"]["depends_on"]["redis-node-3"]["condition"]


def test_every_referenced_file_exists(compose):
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name}: {source} is missing"
        build = service.get("build")
        if build:
            assert (ROOT / build["context"] / build["dockerfile"]).is_file()


def _published(service) -> dict[int, int]:
    out = {}
    for port in service.get("ports", []):
        *_, host, container = port.split(":")
        out[int(container)] = int(host)
    return out


def test_ports_agree_with_configs(compose):
    services = compose["services"]
    ps = load_ps_config(ROOT / "deploy" / "models" / "ps.json")
    nodes = dict(a.rsplit(":", 1) for a in ps.volatile_db.address.split(","))
    for n in (1, 2, 3):
        service = services[f"redis-node-{n}"]
        conf_path = service["volumes"][0].split(":")[0]
        conf = (ROOT / conf_path).read_text()
        port = int(re.search(r"^port (\d+)$", conf, re.M).group(1))
        assert "cluster-enabled yes" in conf
        assert int(nodes[f"redis-node-{n}"]) == port
        assert port in _published(service)
        assert str(port) in " ".join(service["healthcheck"]["test"])
    init = (ROOT / "deploy/redis/cluster-init.sh").read_text()
    for host, port in nodes.items():
        assert f"{host}:{port}" in init

    kafka = (ROOT / "deploy/kafka/server.properties").read_text()
    assert "process.roles=broker,controller" in kafka
    advertised = re.search(r"^advertised.listeners=PLAINTEXT://(\S+)$", kafka, re.M).group(1)
    assert ps.update_source.brokers == advertised
    assert int(advertised.rsplit(":", 1)[1]) in _published(services["kafka"])

    tierserve = services["tierserve"]
    command = tierserve["command"]
    http = int(command[command.index("--http-port") + 1])
    grpc = int(command[command.index("--grpc-port") + 1])
    assert {http, grpc} <= set(_published(tierserve))
    assert command[command.index("--model-repository") + 1] == "/models"
    assert "./deploy/models:/models" in tierserve["volumes"]
    assert ps.persistent_db.path == "/data/rocksdb"
    assert any(v.endswith(":/data/rocksdb") for v in tierserve["volumes"])
    assert ps.models[0].model == "dlrm"


def test_readme_says_how_to_run_it():
    readme = (ROOT / "README.md").read_text()
    assert "docker compose up" in readme and "--profile triton" in readme
