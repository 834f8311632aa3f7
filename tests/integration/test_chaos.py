"""Chaos: mixed traffic from 32 clients while the services fail around the server.

One server over a real three-node Redis Cluster (volatile), RocksDB (persistent) and a real
Kafka broker (online updates).  While 32 clients (a process of their own) send HTTP (binary and JSON), gRPC and
/predict requests and a prober times the health endpoints, the run drops a new version in,
freezes a cluster node and thaws it, kills a node and restarts it empty, publishes a poison
message and updates, and restarts the broker.  Afterwards:

- no request got a 5xx (none is documented for these faults: a frozen or dead node falls
  through to RocksDB), and none failed in the client;
- health answered with p99 under 250 ms (under the 300 ms a probe stuck behind a fault
  would wait; CPU scheduling on a loaded machine alone reaches ~125 ms);
- every answer equals ``InferenceModel.predict`` of the version it names, on the same rows
  (updates only touch keys the requests never use, so the answers have one right value);
- the final tables, in both tiers, equal the new version's files plus every published update.

``TIERSERVE_CHAOS_SECONDS`` sets the length (default 60); the faults keep their proportions.

Then real faults one at a time, each against what a reference server answers with the same
rows: a Redis Cluster master SIGKILLed and its replica promoted (the server follows it within
seconds, answering 200 meanwhile); a broker restarted and the model's topic deleted and
created again (the server applies the new topic's updates); ``tierserve serve`` stopped or
SIGKILLed mid-stream and started again (it says ready only once it replayed the updates).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest
from chaos_traffic import Clients
from frozen import frozen
from kafka_clients import create_topic, delete_topic, raw_producer
from polling import until
from serve_process import (
    demo_repository,
    infer_body,
    predict,
    ready_status,
    serve,
    stop,
    wait_ready,
)

from tierserve.clients.demo_model import train_demo_model, write_repository
from tierserve.model.batch import Batch, SparseInput
from tierserve.ps.kafka_groups import REPLICA_ENV
from tierserve.ps.kafka_producer import UpdateProducer
from tierserve.ps.redis_tier import value_hash
from tierserve.ps.sparse_file import read_sparse_model
from tierserve.server.app import BackgroundServer, free_port
from tierserve.server.inference_model import InferenceModel, InferenceParams
from tierserve.server.runtime.loader import RepositoryLoader
from tierserve.server.settings import Settings

pytestmark = pytest.mark.slow

SECONDS = float(os.environ.get("TIERSERVE_CHAOS_SECONDS", "60"))
TABLE = "sparse_embedding1"
DIM = 16
POOL = 64  # request rows are drawn from these
UPDATE_KEYS = np.arange(5000, 5200, dtype=np.int64)  # never in a request (keys < 300)
HEALTH_P99_S = 0.25  # see the assertion in test_chaos
TRAFFIC = Path(__file__).parents[1] / "chaos_traffic.py"
#: How long after the run the published updates may take to reach a tier: a consumer group's
#: session timeout (45 s) after the broker's restart, a rejoin, and the replay.
UPDATES_WITHIN_S = 120


@pytest.fixture(scope="module")
def versions(tmp_path_factory):
    work = tmp_path_factory.mktemp("chaos")
    return (
        train_demo_model(work / "v1", iterations=10, batch_size=256, seed=1),
        train_demo_model(work / "v2", iterations=30, batch_size=256, seed=2),
    )


def _reference(demo, des, cat) -> np.ndarray:
    params = InferenceParams(
        model_name="ref", max_batchsize=POOL, hit_rate_threshold=0.9,
        dense_model_file=str(demo.dense_file), sparse_model_files=[str(p) for p in demo.sparse_files],
        use_gpu_embedding_cache=False, cache_size_percentage=0.5, i64_input_key=True,
        volatile_db={"type": "hash_map"},
    )  # fmt: skip
    model = InferenceModel(str(demo.graph), params)
    try:
        sparse = SparseInput(cat.reshape(-1), np.arange(cat.size + 1, dtype=np.int64), cat.shape[1])
        return model.predict_batch(Batch(np.zeros((POOL, 1), np.float32), des, (sparse,)))
    finally:
        model.close()


def _repository(root, demo, name: str, cluster, broker) -> None:
    """The demo model as ``name``, on the cluster, RocksDB and the broker."""
    write_repository(demo, root)
    (root / "dlrm").rename(root / name)
    path = root / "ps.json"
    data = json.loads(path.read_text())
    data["models"][0].update(model=name, max_batch_size=64)
    data["volatile_db"] = {
        "type": "redis_cluster", "address": cluster.addresses, "num_partitions": 4,
        "socket_timeout_ms": 300, "connect_timeout_ms": 300, "failure_threshold": 2,
        "failure_backoff_ms": 500, "max_failure_backoff_ms": 2000, "refill_interval_ms": 500,
    }  # fmt: skip
    data["update_source"] = {
        "type": "kafka_message_queue", "brokers": broker.bootstrap,
        "metadata_refresh_interval_ms": 1000, "poll_timeout_ms": 200,
    }  # fmt: skip
    path.write_text(json.dumps(data))


class Traffic:
    """32 clients (a process of their own: tests/chaos_traffic.py) and a health prober (one
    more); records answers, failures and health latencies.  Neither shares the server's
    process: its GIL and heap are part of what a deployment's server has to itself."""

    def __init__(self, server, name: str, des, cat, work: Path) -> None:
        self.server, self.name = server, name
        self.answers: list[tuple[str, np.ndarray, np.ndarray]] = []  # version, rows, output
        self.failures: list[str] = []
        self.health: list[float] = []
        self._inputs, self._result = work / "traffic-inputs.npz", work / "traffic.pkl"
        np.savez(self._inputs, des=des, cat=cat)
        self._clients: subprocess.Popen | None = None
        self._prober: subprocess.Popen | None = None

    def start(self) -> None:
        """Start the clients and the prober; returns once the clients run."""
        self._clients = subprocess.Popen(
            [sys.executable, str(TRAFFIC), self.server.http_url, self.server.grpc_url,
             self.name, str(self._inputs), str(self._result)],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self._clients.stdout.readline().strip() == "ready", "the traffic did not start"
        self._prober = subprocess.Popen(
            [sys.executable, "-c", PROBER, self.server.http_url, self.server.grpc_url],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def join(self) -> None:
        """Stop both and collect what they saw."""
        for proc in (self._clients, self._prober):
            proc.terminate()
        self._clients.wait(timeout=120)
        with open(self._result, "rb") as f:
            seen = pickle.load(f)
        self.answers.extend(seen["answers"])
        self.failures.extend(seen["failures"])
        out, err = self._prober.communicate(timeout=30)
        report = json.loads(out.splitlines()[-1]) if out.strip() else {"latencies": [],
                                                                          "failures": [err]}
        self.health.extend(report["latencies"])
        self.failures.extend(f"health: {f}" for f in report["failures"])


#: Probes HTTP and gRPC liveness every 50 ms until SIGTERM; prints the latencies as JSON.
PROBER = """
import json, signal, sys, time
import httpx, tritonclient.grpc as tg
http = httpx.Client(base_url="http://" + sys.argv[1], timeout=10)
grpc = tg.InferenceServerClient(sys.argv[2])
latencies, failures, running = [], [], [True]
signal.signal(signal.SIGTERM, lambda *a: running.__setitem__(0, False))
turn = 0
while running[0]:
    started = time.perf_counter()
    try:
        if turn % 2:
            grpc.is_server_live(client_timeout=10)
        else:
            http.get("/v2/health/live").raise_for_status()
        latencies.append(time.perf_counter() - started)
    except Exception as exc:
        failures.append(f"{type(exc).__name__}: {exc}")
    turn += 1
    time.sleep(0.05)  # the probes' pace
print(json.dumps({"latencies": latencies, "failures": failures}))
"""


def _poison(broker, topic: str) -> None:
    """A header claiming vectors of 2^32-4 bytes, then nothing (it once stopped both consumers)."""
    producer = raw_producer(broker.bootstrap)
    producer.produce(topic, value=b"HCTR" + struct.pack("<I", 2**32 - 4))
    producer.produce(topic, value=os.urandom(37))
    producer.flush(30)


def test_chaos(versions, redis_cluster, kafka_broker, tmp_path):
    v1, v2 = versions
    name = f"chaos{uuid.uuid4().hex[:8]}"
    repo = tmp_path / "repo"
    _repository(repo, v1, name, redis_cluster, kafka_broker)
    rng = np.random.default_rng(0)
    des = rng.random((POOL, 13), dtype=np.float32)
    cat = rng.integers(0, 300, (POOL, 8)).astype(np.int64)
    expected = {"1": _reference(v1, des, cat), "2": _reference(v2, des, cat)}
    updates = {}  # key -> vector, the last published wins
    at = [0.10, 0.20, 0.35, 0.40, 0.50, 0.55, 0.65, 0.75]
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=0,
                              poll_interval_s=0.2)  # fmt: skip
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)  # as `tierserve serve` runs (server.app.serve)
    with contextlib.ExitStack() as restore:
        restore.callback(sys.setswitchinterval, switch)
        server = restore.enter_context(BackgroundServer(settings))
        traffic = Traffic(server, name, des, cat, tmp_path)
        started = time.monotonic()

        def wait_until(fraction: float) -> None:
            # the timeline of faults under sustained traffic is the test: each fault comes
            # at its point of the run, whatever happened before it
            time.sleep(max(0.0, started + fraction * SECONDS - time.monotonic()))

        def publish(seed: int) -> None:
            vectors = np.random.default_rng(seed).standard_normal((UPDATE_KEYS.size, DIM))
            vectors = vectors.astype(np.float32)
            with UpdateProducer(kafka_broker.bootstrap, max_batch_size=50) as producer:
                producer.publish(name, TABLE, UPDATE_KEYS, vectors)
            updates.update(zip(UPDATE_KEYS.tolist(), vectors))

        traffic.start()
        try:
            wait_until(at[0])
            staging = tmp_path / "v2repo"
            write_repository(v2, staging, version=2)
            shutil.move(staging / "dlrm" / "2", repo / name / "2")
            plane = server.plane
            assert until(lambda: plane.repository.entries[name].version == "2", timeout=30)
            wait_until(at[1])
            with frozen(redis_cluster.servers[0]):
                wait_until(at[2])
            wait_until(at[3])
            redis_cluster.kill_node(1)
            try:
                wait_until(at[4])
            finally:
                redis_cluster.restart_node(1)
            wait_until(at[5])
            _poison(kafka_broker, f"hps_et.{name}.{TABLE}")
            publish(1)
            wait_until(at[6])
            kafka_broker.stop()
            try:
                time.sleep(0.05 * SECONDS)  # the outage's length is the fault
            finally:
                kafka_broker.start()
            wait_until(at[7])
            publish(2)
            wait_until(1.0)
        finally:
            traffic.join()
        ps = server.app.state.plane.repository.loader.parameter_server
        want = np.stack([updates[k] for k in UPDATE_KEYS.tolist()])

        def applied() -> bool:
            return np.array_equal(ps.lookup(name, TABLE, UPDATE_KEYS), want)

        # Each tier has its own consumer group, and each converges on its own.  After the
        # broker's restart a consumer may not find its group's coordinator again before its
        # session times out (45 s, librdkafka's "SESSTMOUT ... broker -1"), then it rejoins.
        assert until(applied, timeout=UPDATES_WITHIN_S), "published updates never arrived"
        served = ps.model(name)
        storage = served.table(TABLE).storage
        trained = read_sparse_model(str(repo / name / "2" / v2.sparse_files[0].name), DIM)
        table = dict(zip(np.asarray(trained.keys).tolist(), np.asarray(trained.embeddings)))
        table.update(updates)
        keys = np.fromiter(table, np.int64)
        truth = np.stack(list(table.values())).astype(np.float32)
        for level, tier in ps.tiers.items():
            # the volatile tier: a restarted node is refilled in the background as well
            def holds_truth(t=tier) -> bool:
                got, found = t.lookup(storage, keys)
                return bool(found.all()) and np.array_equal(got, truth)

            until(holds_truth, timeout=UPDATES_WITHIN_S)
            got, found = tier.lookup(storage, keys)
            assert found.all(), f"{level}: {int((~found).sum())} keys missing"
            np.testing.assert_array_equal(got, truth, err_msg=level)

    health = np.asarray(traffic.health)
    print(f"chaos: {len(traffic.answers)} answers, {len(traffic.failures)} failures, health p50 "
          f"{np.percentile(health, 50) * 1e3:.1f} ms p99 {np.percentile(health, 99) * 1e3:.1f} ms")
    assert not traffic.failures, traffic.failures[:10]
    assert {v for v, _, _ in traffic.answers} == {"1", "2"}
    assert len(traffic.answers) > 100
    for version, rows, out in traffic.answers:
        np.testing.assert_allclose(out, expected[version][rows], atol=1e-5, err_msg=version)
    # Health must not wait behind the faults: a probe queued behind calls to the frozen node
    # waits out their 300 ms socket timeout, again each time the breaker tries the node
    # (every 0.5-2 s, for 15% of the run): several percent of the probes over 300 ms.  From
    # CPU scheduling alone p99 reached 124 ms (p50 6 ms) beside two busy loops on 2 cores,
    # so the bound is 250 ms, still under what one wait behind the node costs.
    assert np.percentile(health, 99) < HEALTH_P99_S, (np.percentile(health, [50, 99]), health.max())



# --- real faults, one at a time: failover, a recreated topic, a restart's replay ----------------

FILLER_ROWS = 150_000  # replayed before the rows the requests read: it takes a second or so
FILLER_KEY = 1_000_000  # filler keys start here, far from the requests' keys (< 300)
#: How soon after a fault is over (a replica promoted, a topic recreated) answers must carry
#: the stored rows again: one topology refresh or topic check, plus slack for a loaded VM.
RECOVERED_WITHIN_S = 5.0


class _Served:
    """The demo model as a fresh model name, served from ``repo`` with ``volatile`` and
    ``source``; a fixed request, its keys, and reference answers (:meth:`answers`)."""

    def __init__(self, tmp_path, demo, volatile: dict, source: dict | None, prefix: str) -> None:
        self.name = f"{prefix}{uuid.uuid4().hex[:8]}"
        self.demo, self.tmp_path = demo, tmp_path
        self.repo = tmp_path / "repo"
        if "update_filters" in volatile:
            volatile = {**volatile, "update_filters": [self.name]}
        self.table, self.dim = demo_repository(demo, self.repo, self.name, volatile, source)
        rng = np.random.default_rng(5)
        des = rng.random((8, 13), dtype=np.float32)
        cat = rng.integers(0, 300, (8, 8)).astype(np.int64)
        self.body = infer_body(des, cat)
        self.keys = np.unique(cat)

    def vectors(self, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        return rng.normal(0, 1, (self.keys.size, self.dim)).astype(np.float32)

    def answers(self, *vector_sets) -> list[np.ndarray]:
        """The answer to the request from the model's files, then after each of
        ``vector_sets`` is written to its keys: a reference server with no Kafka, no Redis."""
        ref_repo = self.tmp_path / f"ref-{uuid.uuid4().hex[:6]}"
        demo_repository(self.demo, ref_repo, self.name, {"type": "hash_map"}, None)
        loader = RepositoryLoader()
        settings = Settings.build(model_repository=ref_repo, http_port=0, grpc_port=None,
                                  poll_interval_s=0)  # fmt: skip
        with BackgroundServer(settings, loader=loader) as ref, httpx.Client() as client:
            url = f"http://{ref.http_url}"
            out = [predict(client, url, self.name, self.body)]
            for vectors in vector_sets:
                loader.parameter_server.insert(self.name, self.table, self.keys, vectors)
                out.append(predict(client, url, self.name, self.body))
        for a, b in zip(out, out[1:]):
            assert np.abs(a - b).max() > 1e-3  # each set changes the answer
        return out

    def publish(self, broker, vectors, keys=None, max_batch_size: int = 1000) -> None:
        keys = self.keys if keys is None else keys
        with UpdateProducer(broker.bootstrap, max_batch_size=max_batch_size) as producer:
            producer.publish(self.name, self.table, keys, vectors)

    def publish_filler(self, broker, start: int, rows: int) -> None:
        keys = np.arange(FILLER_KEY + start, FILLER_KEY + start + rows, dtype=np.int64)
        self.publish(broker, np.ones((rows, self.dim), np.float32), keys)

    def answers_equal(self, client, url: str, want: np.ndarray) -> bool:
        got = predict(client, url, self.name, self.body)
        return bool(np.allclose(got, want, rtol=1e-5, atol=1e-6))


def _server(served: _Served) -> BackgroundServer:
    settings = Settings.build(model_repository=served.repo, http_port=0, grpc_port=None,
                              poll_interval_s=0)  # fmt: skip
    return BackgroundServer(settings)


@pytest.fixture(scope="module")
def fault_demo(tmp_path_factory):
    return train_demo_model(tmp_path_factory.mktemp("faults"), iterations=10, batch_size=256,
                            seed=3)  # fmt: skip


def test_a_killed_redis_master_is_followed_to_its_promoted_replica(
    tmp_path, redis_cluster_factory, fault_demo
):
    """Three masters with a replica each, no persistent tier: while a master is dead its
    keys answer the default vector (200, never an error); once its replica is promoted the
    answers carry the stored rows again within RECOVERED_WITHIN_S."""
    cluster = redis_cluster_factory(masters=3, replicas=1, node_timeout_ms=1000)
    volatile = {"type": "redis_cluster", "address": cluster.addresses, "num_partitions": 6,
                "socket_timeout_ms": 300, "connect_timeout_ms": 300, "failure_threshold": 2,
                "failure_backoff_ms": 200, "max_failure_backoff_ms": 1000,
                "topology_refresh_ms": 500}  # fmt: skip
    served = _Served(tmp_path, fault_demo, volatile, None, "failover")
    (stored,) = served.answers()
    with _server(served) as server, httpx.Client(timeout=30) as client:
        url = f"http://{server.http_url}"
        assert served.answers_equal(client, url, stored)
        cluster.wait_replicated()  # the loaded rows are on the replicas too
        ps = server.app.state.plane.repository.loader.parameter_server
        storage = ps.model(served.name).table(served.table).storage
        victim = cluster.node_index_for_key(value_hash(storage, 0))
        replica = cluster.replicas_of(victim)[0]
        cluster.kill_node(victim)
        killed = time.monotonic()
        answered = []

        def promoted() -> bool:  # requests go on meanwhile: 200s, default vectors for some
            r = client.post(f"{url}/v2/models/{served.name}/infer", json=served.body)
            assert r.status_code == 200, r.text
            answered.append(np.asarray(r.json()["outputs"][0]["data"], np.float32))
            return cluster.role(replica) == "master"

        assert until(promoted, timeout=30), "the replica was never promoted"
        promoted_at = time.monotonic()
        assert any(not np.allclose(a, stored, rtol=1e-5, atol=1e-6) for a in answered), (
            "no answer missed the dead master's rows: the test did not test the outage"
        )
        assert until(lambda: served.answers_equal(client, url, stored), timeout=30), (
            "the promoted replica's rows were never served"
        )
        took = time.monotonic() - promoted_at
        print(f"promoted {promoted_at - killed:.2f} s after the kill; stored rows served "
              f"{took:.2f} s after the promotion was visible")  # fmt: skip
        assert took < RECOVERED_WITHIN_S, took
        assert client.get(f"{url}/v2/health/ready").status_code == 200


def test_a_topic_recreated_after_a_broker_restart_is_applied(
    tmp_path, kafka_broker_factory, fault_demo
):
    """A broker of the test's own is restarted once, then the model's topic is deleted and
    created again: the running server applies the new topic's updates (it used to apply
    nothing more, while ready, alive and with no lag)."""
    broker = kafka_broker_factory()
    source = {"type": "kafka_message_queue", "brokers": broker.bootstrap,
              "poll_timeout_ms": 100, "metadata_refresh_interval_ms": 500}  # fmt: skip
    served = _Served(tmp_path, fault_demo, {"type": "hash_map", "update_filters": []}, source,
                     "recreate")  # fmt: skip
    sets = [served.vectors(seed) for seed in (1, 2, 3)]
    _, first, second, third = served.answers(*sets)
    create_topic(broker, f"hps_et.{served.name}.{served.table}")
    with _server(served) as server, httpx.Client(timeout=30) as client:
        url = f"http://{server.http_url}"
        for _ in range(10):  # offsets 0..9 on the first topic
            served.publish(broker, sets[0])
        assert until(lambda: served.answers_equal(client, url, first), timeout=60)
        broker.stop()
        broker.start()
        served.publish(broker, sets[1])
        assert until(lambda: served.answers_equal(client, url, second), timeout=60)
        delete_topic(broker, f"hps_et.{served.name}.{served.table}")
        create_topic(broker, f"hps_et.{served.name}.{served.table}")
        served.publish(broker, sets[2])  # offset 0 of the new topic
        published = time.monotonic()
        applied = until(lambda: served.answers_equal(client, url, third), timeout=30)
        consumers = server.app.state.plane.repository.loader.consumer_status()
        assert applied, f"the recreated topic's update was never applied: {consumers}"
        took = time.monotonic() - published
        print(f"recreated topic's update served {took:.2f} s after it was published")
        assert took < RECOVERED_WITHIN_S, took
        assert client.get(f"{url}/v2/health/ready").status_code == 200


def _replica_env() -> dict:
    return {k: v for k, v in os.environ.items() if k != REPLICA_ENV}


def _first_ready_answer(served: _Served, proc, url: str, client) -> tuple[float, np.ndarray]:
    """Poll readiness as a load balancer would (every 20 ms); the seconds from the server's
    first answer (it listens once its models are loaded) until it is ready, and the answer
    to the request sent the moment it was."""
    assert until(lambda: ready_status(url) is not None or proc.poll() is not None,
                 timeout=120, interval=0.02)  # fmt: skip
    took = wait_ready(proc, url, interval=0.02)
    return took, predict(client, url, served.name, served.body)


def _replay_model(tmp_path, broker, demo) -> tuple[_Served, np.ndarray]:
    source = {"type": "kafka_message_queue", "brokers": broker.bootstrap,
              "poll_timeout_ms": 100, "metadata_refresh_interval_ms": 500}  # fmt: skip
    served = _Served(tmp_path, demo, {"type": "hash_map", "update_filters": []}, source,
                     "replay")  # fmt: skip
    final = served.vectors(4)
    return served, final


@pytest.mark.parametrize("fault", ["stop", "sigkill"])
def test_a_restarted_server_is_ready_only_after_replaying_the_updates(
    tmp_path, kafka_broker, fault_demo, fault
):
    """``tierserve serve`` with a stable replica id takes many updates, the last ones to the
    request's rows; started again it loads the older files and replays the updates: it must
    not say ready before the replay reached the end offsets seen at start.  ``stop``: the
    first server applied everything and stopped cleanly.  ``sigkill``: it is SIGKILLed while
    updates stream in (it commits nothing more and does not leave its consumer group): the
    restarted one takes its partitions back at once (static membership)."""
    served, final = _replay_model(tmp_path, kafka_broker, fault_demo)
    _, after = served.answers(final)
    replica = ["--replica-id", f"{served.name}-{fault}"]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    procs = []
    with httpx.Client(timeout=30) as client:
        try:
            procs.append(serve(served.repo, port, _replica_env(), *replica))
            wait_ready(procs[-1], url)
            if fault == "stop":
                served.publish_filler(kafka_broker, 0, FILLER_ROWS)
                served.publish(kafka_broker, final)
                assert until(lambda: served.answers_equal(client, url, after), timeout=120)
                stop(procs[-1])
            else:
                served.publish_filler(kafka_broker, 0, FILLER_ROWS // 2)
                keys = 'tierserve_tier_updates_total{outcome="keys",tier="volatile:hash_map"}'
                assert until(lambda: _metric(client, url, keys) > 0, timeout=60)
                procs[-1].kill()  # mid-stream: no commit, no leaving the group
                procs[-1].wait()
                served.publish_filler(kafka_broker, FILLER_ROWS // 2, FILLER_ROWS // 2)
                served.publish(kafka_broker, final)
            procs.append(serve(served.repo, port, _replica_env(), *replica))
            took, first = _first_ready_answer(served, procs[-1], url, client)
            print(f"server restarted after {fault} ready {took:.2f} s after it first answered")
            np.testing.assert_allclose(first, after, rtol=1e-5, atol=1e-6,
                                       err_msg="ready before the replay reached its end")  # fmt: skip
            # Without static membership a SIGKILLed member holds the partitions 45 s.
            assert took < 20, f"ready only {took:.1f} s after it first answered"
        finally:
            stop(*procs)


def _metric(client, url: str, series: str) -> float:
    for line in client.get(f"{url}/metrics").text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0
# --- load/unload storms ----------------------------------------------------------------------

#: What a request may be told while its model is unloaded or loading (503 / UNAVAILABLE).
NOT_SERVING = ("is not ready", "is loading")


class Storm:
    """6 clients (binary HTTP, gRPC, JSON) against ``name`` while two admin clients load and
    unload it as fast as the server answers; records every answer and every failure."""

    def __init__(self, server, name: str, des, cat, admin: bool = True) -> None:
        self.server, self.name, self.des, self.cat = server, name, des, cat
        self.answers: list[tuple[str, np.ndarray, np.ndarray]] = []
        self.refused = 0  # answers saying the model does not serve right now
        self.failures: list[str] = []
        self.admin_calls = 0
        self.stop = threading.Event()
        self._lock = threading.Lock()
        kinds = ["http", "http", "grpc", "grpc", "json", "json"]
        self.threads = [threading.Thread(target=self._client, args=(k, i), daemon=True)
                        for i, k in enumerate(kinds)]  # fmt: skip
        if admin:
            self.threads += [threading.Thread(target=self._admin, args=(op,), daemon=True)
                             for op in ("load", "unload")]  # fmt: skip

    def __enter__(self) -> Storm:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)

    def _answer(self, version: str, out, rows) -> None:
        with self._lock:
            self.answers.append((version, rows, np.asarray(out, np.float32).reshape(-1, 1)))

    def _error(self, what: str, message: str) -> None:
        with self._lock:
            if any(m in message for m in NOT_SERVING):
                self.refused += 1
            else:
                self.failures.append(f"{what}: {message[:300]}")

    def _client(self, kind: str, seed: int) -> None:
        rng = np.random.default_rng(100 + seed)
        clients = Clients(self.server, timeout=60)
        while not self.stop.is_set():
            rows = rng.choice(POOL, size=int(rng.integers(1, 9)), replace=False)
            try:
                self._answer(*clients.infer(kind, self.name, self.des[rows], self.cat[rows]),
                             rows)  # fmt: skip
            except Exception as exc:  # noqa: BLE001 - every failure is the test's finding
                self._error(f"{kind} {type(exc).__name__}", str(exc))
        clients.close()

    def _admin(self, op: str) -> None:
        with httpx.Client(base_url=f"http://{self.server.http_url}", timeout=120) as plain:
            while not self.stop.is_set():
                r = plain.post(f"/v2/repository/models/{self.name}/{op}")
                with self._lock:
                    self.admin_calls += 1
                    if r.status_code != 200:
                        self.failures.append(f"{op} {r.status_code}: {r.text[:300]}")

    def check(self, expected: dict[str, np.ndarray]) -> None:
        """No failure; every 200 answer equals the predict of the version it names."""
        print(f"storm: {len(self.answers)} answers, {self.refused} refused while unloaded, "
              f"{self.admin_calls} loads and unloads, {len(self.failures)} failures")  # fmt: skip
        assert not self.failures, self.failures[:10]
        assert len(self.answers) > 50
        wrong = [(v, rows.tolist()) for v, rows, out in self.answers
                 if not np.allclose(out, expected[v][rows], atol=1e-5)]  # fmt: skip
        assert not wrong, f"{len(wrong)} wrong answers, e.g. {wrong[:5]}"


def _plain_repository(root, demo) -> None:
    """The demo model in ``root`` (hash map and RocksDB beside the repository)."""
    write_repository(demo, root)
    path = root / "ps.json"
    data = json.loads(path.read_text())
    data["models"][0]["max_batch_size"] = POOL
    path.write_text(json.dumps(data))


def _pool(seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.random((POOL, 13), dtype=np.float32),
            rng.integers(0, 300, (POOL, 8)).astype(np.int64))  # fmt: skip


def test_a_load_unload_storm_answers_only_with_the_version_it_names(versions, tmp_path):
    """Two admin clients load and unload the model as fast as they can while 6 clients send
    requests, and version 2 lands halfway: each request is refused (model not ready) or
    answered wholly by the version it names, never by a version whose tables were dropped
    (default embeddings) or are missing (404)."""
    v1, v2 = versions
    repo = tmp_path / "repo"
    _plain_repository(repo, v1)
    des, cat = _pool()
    expected = {"1": _reference(v1, des, cat), "2": _reference(v2, des, cat)}
    seconds = max(10.0, SECONDS / 3)
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=0,
                              poll_interval_s=0.2)  # fmt: skip
    with BackgroundServer(settings) as server, Storm(server, "dlrm", des, cat) as storm:
        time.sleep(seconds / 2)  # the storm before the swap (its length is the test's)
        assert until(lambda: {v for v, _, _ in storm.answers} >= {"1"}, timeout=60)
        write_repository(v2, tmp_path / "staging", version=2)
        shutil.move(tmp_path / "staging" / "dlrm" / "2", repo / "dlrm" / "2")
        assert until(lambda: {v for v, _, _ in storm.answers} >= {"2"}, timeout=60)
        time.sleep(seconds / 2)  # and after it
    storm.check(expected)


# --- the served dense file changed on disk ----------------------------------------------------


class WorkerPool:
    """``tierserve serve --workers 2`` in a subprocess (its log kept beside the repository)."""

    def __init__(self, repo) -> None:
        from tierserve.server.app import free_port

        self.http, self.grpc = free_port(), free_port()
        self.log = repo.parent / "pool.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tierserve.clients.cli", "serve", "--model-repository",
             str(repo), "--workers", "2", "--http-port", str(self.http), "--grpc-port",
             str(self.grpc), "--threads", "1", "--poll-interval", "0.2"],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.http_url, self.grpc_url = f"127.0.0.1:{self.http}", f"127.0.0.1:{self.grpc}"

    def ready(self) -> bool:
        try:
            return httpx.get(f"http://{self.http_url}/v2/health/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def workers(self) -> set[int]:
        proc = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return {int(pid) for pid in proc.read_text().split()
                if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()}  # fmt: skip

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def test_overwriting_the_served_dense_file_neither_kills_a_worker_nor_changes_answers(
    versions, tmp_path
):
    """Under ``--workers 2`` with clients sending requests, the serving version's dense file is
    overwritten in place with a plain copy (another run's weights), truncated to nothing and
    to half, and copied back: no worker dies (a memory-mapped file that shrinks is a SIGBUS),
    and every answer stays version 1's own (a mapped file copied over would change them)."""
    v1, v2 = versions
    repo = tmp_path / "repo"
    _plain_repository(repo, v1)
    data = json.loads((repo / "ps.json").read_text())
    data.pop("persistent_db")  # a hash map alone: the workers may share the repository
    data["volatile_db"] = {"type": "hash_map"}
    (repo / "ps.json").write_text(json.dumps(data))
    served = repo / "dlrm" / "1" / v1.dense_file.name
    original = served.read_bytes()
    des, cat = _pool(1)
    expected = {"1": _reference(v1, des, cat)}
    pool = WorkerPool(repo)
    try:
        assert until(pool.ready, timeout=180), pool.log.read_text()[-3000:]
        workers = pool.workers()
        assert len(workers) == 2
        with Storm(pool, "dlrm", des, cat, admin=False) as storm:
            assert until(lambda: len(storm.answers) > 20, timeout=60)
            for step in ("copy", "truncate", "half", "restore"):
                if step == "copy":
                    subprocess.run(["cp", str(v2.dense_file), str(served)], check=True)
                elif step == "truncate":
                    os.truncate(served, 0)
                elif step == "half":
                    served.write_bytes(original[: len(original) // 2])
                else:
                    served.write_bytes(original)
                seen = len(storm.answers)
                assert until(lambda s=seen: len(storm.answers) > s + 20, timeout=60), step
        assert pool.workers() == workers, pool.log.read_text()[-3000:]
        assert "exited" not in pool.log.read_text()
    finally:
        pool.stop()
    storm.check(expected)
