"""Two ``tierserve serve`` processes on one host and one Kafka broker, each with its embedding
cache on: an update published to Kafka reaches both within a second,
whether they share one Redis (only one of them applies the update to it) or each keeps its
own hash map (each is its own replica, not two halves of one consumer group)."""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import httpx
import numpy as np
import pytest
from serve_process import demo_repository, infer_body, predict, serve, stop, wait_ready

from tierserve.clients.demo_model import train_demo_model
from tierserve.ps.kafka_groups import REPLICA_ENV
from tierserve.ps.kafka_producer import UpdateProducer
from tierserve.server.app import BackgroundServer, free_port
from tierserve.server.runtime.loader import RepositoryLoader
from tierserve.server.settings import Settings

pytestmark = pytest.mark.kafka


def _close(got: np.ndarray, want: np.ndarray) -> bool:
    return bool(np.allclose(got, want, rtol=1e-5, atol=1e-6))


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
    cache = {"gpucache": True, "gpucacheper": 1.0}  # the CPU cache where there is no GPU
    table, dim = demo_repository(demo, tmp_path / "repo", name, tier, source, **cache)
    rng = np.random.default_rng(11)
    des = rng.random((8, 13), dtype=np.float32)
    cat = rng.integers(0, 300, (8, 8)).astype(np.int64)
    body = infer_body(des, cat)
    keys = np.unique(cat)
    new = rng.normal(0, 1, (keys.size, dim)).astype(np.float32)
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"hps_et.{name}.{table}"  # one partition: one process applies each update
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])[topic].result(30)

    # The reference: the same model files in an in-process hash map with no cache and no
    # Kafka, the same update inserted directly.
    demo_repository(demo, tmp_path / "ref", name, {"type": "hash_map"}, None, gpucache=False)
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
                procs.append(serve(tmp_path / "repo", port, env, *args))
                wait_ready(procs[-1], url)
            before = predict(client, ref_url, name, body)
            for url in urls:  # warm both caches: these rows are cached from here on
                for _ in range(3):
                    assert _close(predict(client, url, name, body), before)
            loader.parameter_server.insert(name, table, keys, new)
            after = predict(client, ref_url, name, body)
            assert np.abs(after - before).max() > 1e-3  # the update changes these rows
            with UpdateProducer(kafka_broker.bootstrap) as producer:
                producer.publish(name, table, keys, new)
            published = time.monotonic()
            fresh = [False, False]
            while not all(fresh) and time.monotonic() - published < 10:
                for i, url in enumerate(urls):
                    if not fresh[i]:
                        got = predict(client, url, name, body)
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
            stop(*procs)
