"""Online updates end to end: a server whose ps.json names a Kafka update source applies the
updates a producer publishes, and its predictions change accordingly."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid

import numpy as np
import pytest
import tritonclient.http as th
from kafka_clients import raw_producer
from polling import until

from tierserve.clients.demo_model import train_demo_model, write_repository
from tierserve.ps.kafka_producer import UpdateProducer
from tierserve.ps.update_message import encode_update
from tierserve.server.app import BackgroundServer, free_port
from tierserve.server.runtime.loader import RepositoryLoader
from tierserve.server.settings import Settings

pytestmark = pytest.mark.kafka


def _kafka_repository(demo, tmp_path, kafka_broker) -> tuple:
    """The demo model's repository with the broker as its update source and its RocksDB in
    ``tmp_path``: (folder, its ps.json as a dict)."""
    repo = tmp_path / "repo"
    write_repository(demo, repo)
    config = json.loads((repo / "ps.json").read_text())
    config["update_source"] = {
        "type": "kafka_message_queue", "brokers": kafka_broker.bootstrap,
        "poll_timeout_ms": 100, "metadata_refresh_interval_ms": 500,
    }  # fmt: skip
    config["persistent_db"]["path"] = str(tmp_path / "rocksdb")
    (repo / "ps.json").write_text(json.dumps(config))
    return repo, config


def _predict(url, des, cat):
    client = th.InferenceServerClient(url)
    a = th.InferInput("DES", list(des.shape), "FP32")
    a.set_data_from_numpy(des)
    b = th.InferInput("CATCOLUMN", list(cat.shape), "INT64")
    b.set_data_from_numpy(cat)
    return client.infer("dlrm", [a, b]).as_numpy("OUTPUT0")


def test_published_updates_change_what_the_server_serves(tmp_path, kafka_broker):
    demo = train_demo_model(tmp_path / "train", iterations=20, batch_size=256, seed=3)
    repo, config = _kafka_repository(demo, tmp_path, kafka_broker)
    table = config["models"][0]["embedding_table_names"][0]
    rng = np.random.default_rng(0)
    des = rng.random((4, 13), dtype=np.float32)
    cat = rng.integers(0, 300, (4, 8)).astype(np.int64)
    loader = RepositoryLoader()
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=None,
                              poll_interval_s=0)  # fmt: skip
    with BackgroundServer(settings, loader=loader) as server:
        before = _predict(server.http_url, des, cat)
        assert {c.level for c in loader.update_consumers} == {"volatile", "persistent"}
        keys = np.unique(cat)
        dim = config["models"][0]["embedding_vecsize_per_table"][0]
        new = rng.normal(0, 1, (keys.size, dim)).astype(np.float32)
        # The topic may not exist yet: publish until both tiers have seen the update.
        producer = UpdateProducer(kafka_broker.bootstrap)
        producer.publish("dlrm", table, keys, new)
        producer.flush()
        assert until(lambda: all(c.stats.messages >= 1 for c in loader.update_consumers)), [
            c.stats for c in loader.update_consumers
        ]
        ps = loader.parameter_server
        np.testing.assert_array_equal(ps.lookup("dlrm", table, keys), new)
        after = _predict(server.http_url, des, cat)
        assert np.abs(after - before).max() > 1e-3  # the served model uses the new vectors
        metrics = urllib.request.urlopen(f"http://{server.http_url}/metrics").read().decode()
        applied = [line for line in metrics.splitlines()
                   if line.startswith("tierserve_tier_updates_total{") and 'outcome="keys"' in line
                   and 'tier="volatile:hash_map"' in line]  # fmt: skip
        assert len(applied) == 1 and float(applied[0].rsplit(" ", 1)[1]) >= keys.size
        group = {c.level: c.group for c in loader.update_consumers}
        assert group["volatile"].startswith("hps.volatile.")  # hash_map: one per replica
    assert loader.update_consumers == []  # closed with the server


def _metric(url: str, series: str) -> float:
    """The value of one series (name and labels as the exposition writes them) of /metrics."""
    text = urllib.request.urlopen(f"{url}/metrics").read().decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.rsplit(" ", 1)[0] == series]  # fmt: skip
    assert len(values) == 1, f"{series} not in\n{text}"
    return values[0]


def _ready(url: str) -> bool:
    try:
        return urllib.request.urlopen(f"{url}/v2/health/ready").status == 200
    except urllib.error.HTTPError:
        return False


def _hostile_values(rng, dim: int) -> list[bytes]:
    """Values no consumer may stop on: the header that killed both consumer threads once
    (value_size 2**32 - 4), other huge or odd value sizes, truncated records, wrong
    dims, NaN, and random bytes with and without the magic."""

    def header(value_size: int) -> bytes:
        return b"HCTR" + int(value_size).to_bytes(4, "little")

    values = [header(2**32 - 4), header(2**31), header(2**32 - 4) + bytes(12), header(0),
              header(6) + bytes(14), header(4 * dim) + b"\x01" * 7, b"", b"HCTR",
              encode_update(np.arange(2), np.ones((2, dim + 1), np.float32)),
              encode_update(np.arange(1), np.full((1, dim), np.nan, np.float32))]  # fmt: skip
    for _ in range(20):
        body = rng.bytes(int(rng.integers(0, 64)))
        values.append(body if rng.random() < 0.5 else header(rng.integers(0, 2**32)) + body)
    return values


def test_hostile_messages_do_not_stop_updates_nor_health(tmp_path, kafka_broker):
    demo = train_demo_model(tmp_path / "train", iterations=5, batch_size=256, seed=5)
    repo, config = _kafka_repository(demo, tmp_path, kafka_broker)
    table = config["models"][0]["embedding_table_names"][0]
    dim = config["models"][0]["embedding_vecsize_per_table"][0]
    rng = np.random.default_rng(5)
    topic = f"hps_et.dlrm.{table}"
    raw = raw_producer(kafka_broker.bootstrap)
    hostile = _hostile_values(rng, dim)
    for value in hostile:  # all before the good update, on one partition: read first
        raw.produce(topic, value=value, partition=0)
    keys = np.array([1, 2, 3], np.int64)
    new = rng.normal(0, 1, (keys.size, dim)).astype(np.float32)
    raw.produce(topic, value=encode_update(keys, new), partition=0)
    assert raw.flush(30) == 0
    loader = RepositoryLoader()
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=None,
                              poll_interval_s=0)  # fmt: skip
    with BackgroundServer(settings, loader=loader) as server:
        ps = loader.parameter_server
        assert until(lambda: np.array_equal(ps.lookup("dlrm", table, keys), new)), [
            c.stats for c in loader.update_consumers
        ]
        for consumer in loader.update_consumers:
            status = consumer.status()
            assert status.alive and status.restarts == 0, status
        url = f"http://{server.http_url}"
        # Ready once both tiers' consumers read to the end (the persistent one may be behind
        # the volatile one whose lookup was awaited above).
        assert until(lambda: _ready(url), timeout=30)
        volatile = 'role="apply",tier="volatile:hash_map"'
        assert _metric(url, f"tierserve_update_consumers_alive{{{volatile}}}") == 1
        assert _metric(url, f"tierserve_update_consumer_restarts_total{{{volatile}}}") == 0
        assert _metric(url, f"tierserve_update_consumers_caught_up{{{volatile}}}") == 1
        assert _metric(url, 'tierserve_tier_updates_total{outcome="malformed",'
                       'tier="volatile:hash_map"}') >= 20  # fmt: skip
        # A consumer that does not run makes the server not ready, and shows in the metrics.
        next(c for c in loader.update_consumers if c.level == "persistent").close()
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/v2/health/ready")
        assert refused.value.code == 503
        persistent = 'role="apply",tier="persistent:rocks_db"'
        assert _metric(url, f"tierserve_update_consumers_alive{{{persistent}}}") == 0


def test_updates_of_a_model_the_server_does_not_serve_are_never_fetched(tmp_path, kafka_broker):
    # Before: a partition of any model the server had not loaded was paused until that
    # model loaded (a waiting partition and a lag forever); then such updates were fetched
    # and skipped, so a new replica on brokers shared with other deployments read their
    # whole backlog before its own models' updates.  Now it subscribes to the topics of its
    # ps.json's models only (the default filters match every model).
    demo = train_demo_model(tmp_path / "train", iterations=5, batch_size=256, seed=6)
    repo, config = _kafka_repository(demo, tmp_path, kafka_broker)
    table = config["models"][0]["embedding_table_names"][0]
    dim = config["models"][0]["embedding_vecsize_per_table"][0]
    keys = np.array([4, 5], np.int64)
    new = np.full((keys.size, dim), 0.5, np.float32)
    other = f"other{uuid.uuid4().hex[:8]}"
    with UpdateProducer(kafka_broker.bootstrap) as producer:
        producer.publish(other, table, keys, new)
        producer.publish("dlrm", table, keys, new)
    loader = RepositoryLoader()
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=None,
                              poll_interval_s=0)  # fmt: skip
    with BackgroundServer(settings, loader=loader) as server:
        url = f"http://{server.http_url}"
        ps = loader.parameter_server
        assert until(lambda: np.array_equal(ps.lookup("dlrm", table, keys), new))

        def nothing_waits() -> bool:
            return all(
                _metric(url, f'tierserve_update_partitions_waiting{{tier="{tier}"}}') == 0
                for tier in ("volatile:hash_map", "persistent:rocks_db"))  # fmt: skip

        assert until(nothing_waits, timeout=30)
        assert until(lambda: _ready(url), timeout=30)
        for consumer in loader.update_consumers:
            assert consumer.stats.rejected == 0, consumer.stats  # none of `other` fetched
            assert {t for t, _ in consumer._assigned} == {f"hps_et.dlrm.{table}"}
            assert consumer.pattern == r"^hps_et\.(dlrm)\.[A-Za-z0-9_-]+$"


def test_a_server_that_cannot_read_its_topics_end_offsets_is_not_ready_and_says_why(tmp_path):
    # Nothing listens at the brokers' address: the consumers cannot learn how far the topics
    # go, so the server cannot know whether its tables are as current as the updates.
    demo = train_demo_model(tmp_path / "train", iterations=5, batch_size=256, seed=3)
    repo = tmp_path / "repo"
    write_repository(demo, repo)
    config = json.loads((repo / "ps.json").read_text())
    config["persistent_db"]["path"] = str(tmp_path / "rocksdb")
    config["update_source"] = {"type": "kafka_message_queue",
                               "brokers": f"127.0.0.1:{free_port()}"}  # fmt: skip
    (repo / "ps.json").write_text(json.dumps(config))
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=None,
                              poll_interval_s=0)  # fmt: skip
    with BackgroundServer(settings) as server:
        url = f"http://{server.http_url}"

        def says_why() -> bool:
            try:
                urllib.request.urlopen(f"{url}/v2/health/ready")
            except urllib.error.HTTPError as exc:
                body = json.loads(exc.read())
                return exc.code == 503 and "end offsets" in body["error"]
            return False

        assert until(says_why, timeout=30)
        volatile = 'role="apply",tier="volatile:hash_map"'
        assert _metric(url, f"tierserve_update_consumers_caught_up{{{volatile}}}") == 0
        assert _metric(url, f"tierserve_update_consumers_alive{{{volatile}}}") == 1
        # It serves meanwhile: not ready is advice to a load balancer, not a refusal.
        assert urllib.request.urlopen(f"{url}/v2/health/live").status == 200


def test_no_update_source_starts_no_consumer(tmp_path):
    demo = train_demo_model(tmp_path / "train", iterations=5, batch_size=256, seed=3)
    repo = tmp_path / "repo"
    write_repository(demo, repo)
    config = json.loads((repo / "ps.json").read_text())
    config["persistent_db"]["path"] = str(tmp_path / f"rocksdb-{uuid.uuid4().hex[:6]}")
    (repo / "ps.json").write_text(json.dumps(config))
    loader = RepositoryLoader()
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=None,
                              poll_interval_s=0)  # fmt: skip
    with BackgroundServer(settings, loader=loader):
        assert loader.update_consumers == []


def test_an_inference_model_with_a_kafka_update_source_reads_updates(tmp_path, kafka_broker):
    # The seed API: InferenceModel builds its own parameter server from InferenceParams and
    # applies the updates of its update_source until it is closed.
    from tierserve.ps.params import UpdateSourceParams, UpdateSourceType_t
    from tierserve.server.inference_model import InferenceModel, InferenceParams

    demo = train_demo_model(tmp_path / "train", iterations=5, batch_size=256, seed=4)
    source = UpdateSourceParams(
        type=UpdateSourceType_t.kafka_message_queue, brokers=kafka_broker.bootstrap,
        poll_timeout_ms=100, metadata_refresh_interval_ms=500,
    )  # fmt: skip
    name = f"dlrm{uuid.uuid4().hex[:8]}"
    params = InferenceParams(name, 64, 0.9, str(demo.dense_file),
                             [str(p) for p in demo.sparse_files], False, 0.5, True,
                             update_source=source)  # fmt: skip
    model = InferenceModel(str(demo.graph), params)
    try:
        assert [c.level for c in model.update_consumers] == ["volatile"]
        table = model.table_names[0]
        keys = np.array([1, 2, 3], np.int64)
        dim = model.parameter_server.lookup(name, table, keys).shape[1]
        new = np.full((3, dim), 0.75, np.float32)
        with UpdateProducer(kafka_broker.bootstrap) as producer:
            producer.publish(name, table, keys, new)
        assert until(lambda: model.update_consumers[0].stats.messages >= 1)
        np.testing.assert_array_equal(model.parameter_server.lookup(name, table, keys), new)
    finally:
        model.close()
    assert model.update_consumers == []
