"""Two ``tierserve serve`` processes on one host and one Kafka broker, each with its embedding
cache on: an update published to Kafka reaches both within a second (issue 11, defect 3),
whether they share one Redis (only one of them applies the update to it) or each keeps its
own hash map (each is its own replica, not two halves of one consumer group)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid

import httpx
import numpy as np
import pytest

from tierserve.clients.demo_model import train_demo_model, write_repository
from tierserve.ps.kafka_updates import REPLICA_ENV, UpdateProducer
from tierserve.server.app import BackgroundServer, free_port
from tierserve.server.loader import RepositoryLoader
from tierserve.server.settings import Settings

pytestmark = pytest.mark.kafka


def _repository(demo, folder, name: str, volatile: dict, update_source: dict | None):
    """The demo model as model ``name`` (so its topic is this test's alone)."""
    write_repository(demo, folder)
    shutil.move(folder / "dlrm", folder / name)
    config = json.loads((folder / "ps.json").read_text())
    entry = config["models"][0]
    entry["model"] = name
    for field in ("dense_file", "network_file"):
        entry[field] = entry[field].replace("dlrm/", f"{name}/", 1)
    entry["sparse_files"] = [f.replace("dlrm/", f"{name}/", 1) for f in entry["sparse_files"]]
    entry.update(gpucache=True, gpucacheper=1.0)  # the CPU cache where there is no GPU
    config["volatile_db"] = volatile
    config["persistent_db"] = {"type": "disabled"}
    if update_source is not None:
        config["update_source"] = update_source
    (folder / "ps.json").write_text(json.dumps(config))
    return entry["embedding_table_names"][0], entry["embedding_vecsize_per_table"][0]


def _infer_body(des: np.ndarray, cat: np.ndarray) -> dict:
    return {"inputs": [
        {"name": "DES", "datatype": "FP32", "shape": list(des.shape),
         "data": des.reshape(-1).tolist()},
        {"name": "CATCOLUMN", "datatype": "INT64", "shape": list(cat.shape),
         "data": cat.reshape(-1).tolist()},
    ]}  # fmt: skip


def _predict(client: httpx.Client, url: str, name: str, body: dict) -> np.ndarray:
    r = client.post(f"{url}/v2/models/{name}/infer", json=body)
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["outputs"][0]["data"], np.float32)


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    return bool(np.allclose(got, want, rtol=1e-5, atol=1e-6))


def _serve(repo, port: int, env: dict, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tierserve.clients.cli", "serve", "--model-repository", str(repo),
         "--http-port", str(port), "--no-grpc", "--poll-interval", "0", "--log-level", "warning",
         "--workers", "1", *args],  # one process per server: two replicas, not worker pools
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def _wait_ready(proc: subprocess.Popen, url: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{url}/v2/health/ready").status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
        assert time.monotonic() < deadline, f"{url} not ready after {timeout} s"
        time.sleep(0.2)


@pytest.mark.parametrize("volatile", [pytest.param("redis", marks=pytest.mark.redis), "hash_map"])
def test_two_servers_on_one_host_both_serve_a_published_update_within_a_second(
    tmp_path, request, kafka_broker, volatile
):
    name = f"dlrm{uuid.uuid4().hex[:8]}"
    demo = train_demo_model(tmp_path / "train", iterations=20, batch_size=256, seed=11)
    source = {"type": "kafka_message_queue", "brokers": kafka_broker.bootstrap,
              "poll_timeout_ms": 100, "metadata_refresh_interval_ms": 500,
              "max_commit_interval": 1}  # fmt: skip
    tier = {"type": volatile, "update_filters": [name]}
    if volatile == "redis":
        redis_server = request.getfixturevalue("redis_server")
        tier.update(address=redis_server.url, num_partitions=2)
    table, dim = _repository(demo, tmp_path / "repo", name, tier, source)
    rng = np.random.default_rng(11)
    des = rng.random((8, 13), dtype=np.float32)
    cat = rng.integers(0, 300, (8, 8)).astype(np.int64)
    body = _infer_body(des, cat)
    keys = np.unique(cat)
    new = rng.normal(0, 1, (keys.size, dim)).astype(np.float32)
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"hps_et.{name}.{table}"  # one partition: one process applies each update
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)

    # The reference: the same model files in an in-process hash map with no cache and no
    # Kafka, the same update inserted directly.
    _repository(demo, tmp_path / "ref", name, {"type": "hash_map"}, None)
    ref_config = json.loads((tmp_path / "ref" / "ps.json").read_text())
    ref_config["models"][0]["gpucache"] = False
    (tmp_path / "ref" / "ps.json").write_text(json.dumps(ref_config))
    loader = RepositoryLoader()
    ref_settings = Settings.build(model_repository=tmp_path / "ref", http_port=0,
                                  grpc_port=None, poll_interval_s=0)  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != REPLICA_ENV}  # one replica per process
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    procs: list[subprocess.Popen] = []
    with BackgroundServer(ref_settings, loader=loader) as ref, httpx.Client() as client:
        ref_url = f"http://{ref.http_url}"
        try:
            # One after the other (both may fill Redis); the first names its replica, the
            # second takes the default, unique to its process.
            for port, url, args in zip(ports, urls, [["--replica-id", f"{name}-a"], []]):
                procs.append(_serve(tmp_path / "repo", port, env, *args))
                _wait_ready(procs[-1], url)
            before = _predict(client, ref_url, name, body)
            for url in urls:  # warm both caches: these rows are cached from here on
                for _ in range(3):
                    assert _close(_predict(client, url, name, body), before)
            loader.parameter_server.insert(name, table, keys, new)
            after = _predict(client, ref_url, name, body)
            assert np.abs(after - before).max() > 1e-3  # the update changes these rows
            with UpdateProducer(kafka_broker.bootstrap) as producer:
                producer.publish(name, table, keys, new)
            published = time.monotonic()
            fresh = [False, False]
            while not all(fresh) and time.monotonic() - published < 10:
                for i, url in enumerate(urls):
                    if not fresh[i]:
                        got = _predict(client, url, name, body)
                        fresh[i] = _close(got, after)
                took = time.monotonic() - published
                time.sleep(0.02)
            print(f"both replicas fresh after {took:.3f} s")
            assert all(fresh), f"fresh after 10 s: {fresh} (stale caches)"
            assert took < 1.0, f"both replicas served the update only after {took:.2f} s"
            groups = {g.group_id for g in admin.list_consumer_groups().result(30).valid}
            named = f"hps.volatile.{name}-a" + (".cache" if volatile == "redis" else "")
            assert named in groups, sorted(groups)
            for url in urls:
                metrics = client.get(f"{url}/metrics").text
                hit = [line for line in metrics.splitlines()
                       if line.startswith("tierserve_cache_hit_rate{")]  # fmt: skip
                assert hit and float(hit[0].rsplit(" ", 1)[1]) > 0, metrics  # the cache served
                assert client.get(f"{url}/v2/health/ready").status_code == 200
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
