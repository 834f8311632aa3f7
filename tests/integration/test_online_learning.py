"""The online learning loop against the real broker: a trainer keeps training and publishing
while a server serves, and the served model ends as the trainer's, row for row; also after a
server restart and a broker restart in the middle of the stream."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest
import tritonclient.http as th
from polling import until

from tierserve.clients.demo_model import SLOT_SIZES, train_demo_model, write_repository
from tierserve.model.batch import Batch, SparseInput
from tierserve.server.app import BackgroundServer
from tierserve.server.runtime.loader import RepositoryLoader
from tierserve.server.settings import Settings

pytestmark = pytest.mark.kafka
TABLE = "sparse_embedding1"
ROWS = 64


def _repository(tmp_path, kafka_broker, seed: int):
    demo = train_demo_model(tmp_path / "train", iterations=10, batch_size=256, seed=seed,
                            num_samples=16384)  # fmt: skip
    repo = tmp_path / "repo"
    write_repository(demo, repo)
    config = json.loads((repo / "ps.json").read_text())
    config["update_source"] = {
        "type": "kafka_message_queue",
        "brokers": kafka_broker.bootstrap,
        "poll_timeout_ms": 100,
    }  # metadata_refresh_interval_ms: the default (1 s)
    config["persistent_db"]["path"] = str(tmp_path / "rocksdb")
    (repo / "ps.json").write_text(json.dumps(config))
    return demo, repo


def _rows(model, seed: int = 0):
    """Dense features and one key per slot for ROWS samples, of keys the trainer has (a key it
    never saw is the server's default vector, and the trainer's random initial one)."""
    rng = np.random.default_rng(seed)
    keys = np.sort(model.tables[0].export().keys)
    bounds = np.concatenate([[0], np.cumsum(SLOT_SIZES)])
    cat = np.empty((ROWS, len(SLOT_SIZES)), np.int64)
    for slot in range(len(SLOT_SIZES)):
        trained = keys[(keys >= bounds[slot]) & (keys < bounds[slot + 1])]
        cat[:, slot] = rng.choice(trained, ROWS)
    return rng.random((ROWS, 13), dtype=np.float32), cat


def _trainer_predict(model, des, cat) -> np.ndarray:
    slots = cat.shape[1]
    batch = Batch(label=np.zeros((des.shape[0], 1), np.float32), dense=des,
                  sparse=(SparseInput(cat.reshape(-1), np.arange(cat.size + 1), slots),))  # fmt: skip
    return model.predict_batch(batch)


def _served_predict(url, des, cat) -> np.ndarray:
    client = th.InferenceServerClient(url)
    a = th.InferInput("DES", list(des.shape), "FP32")
    a.set_data_from_numpy(des)
    b = th.InferInput("CATCOLUMN", list(cat.shape), "INT64")
    b.set_data_from_numpy(cat)
    return client.infer("dlrm", [a, b]).as_numpy("OUTPUT0")


def _server(repo, loader):
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=None,
                              poll_interval_s=0.2)  # fmt: skip
    return BackgroundServer(settings, loader=loader)


def _tables_equal(ps, model) -> bool:
    """Both tiers hold the trainer's table, row for row."""
    table = model.tables[0].export()
    for tier in ps.tiers.values():
        storage = ps.model("dlrm").table(TABLE).storage
        got, found = tier.lookup(storage, table.keys)
        if not (found.all() and np.array_equal(got, table.embeddings)):
            return False
    return True


def _mismatch(ps, model) -> str:
    table = model.tables[0].export()
    out = []
    for level, tier in ps.tiers.items():
        got, found = tier.lookup(ps.model("dlrm").table(TABLE).storage, table.keys)
        diff = np.abs(got - table.embeddings).max(axis=1)
        out.append(f"{level}: {int((~found).sum())} missing, {int((diff > 0).sum())} differ "
                   f"of {table.keys.size}")  # fmt: skip
    return "; ".join(out)


def test_a_model_trained_while_served_is_served_as_the_trainer_has_it(tmp_path, kafka_broker):
    demo, repo = _repository(tmp_path, kafka_broker, seed=11)
    des, cat = _rows(demo.model)
    loader = RepositoryLoader()
    with _server(repo, loader) as server:
        before = _served_predict(server.http_url, des, cat)
        np.testing.assert_allclose(before, _trainer_predict(demo.model, des, cat), atol=1e-5)
        # Sparse rows by Kafka every 10 iterations, dense weights by a version every 20.
        demo.model.fit(max_iter=40, display=1000, eval_interval=0, update_source=kafka_broker.bootstrap,
                       publish_interval=10, repository=str(repo), export_interval=20)  # fmt: skip
        assert sorted(p.name for p in (repo / "dlrm").iterdir()) == ["1", "2", "3"]
        want = _trainer_predict(demo.model, des, cat)
        assert np.abs(want - before).max() > 1e-3  # the model did move
        assert until(
            lambda: np.abs(_served_predict(server.http_url, des, cat) - want).max() <= 1e-5,
            timeout=30,
        ), np.abs(_served_predict(server.http_url, des, cat) - want).max()
        ps = loader.parameter_server
        assert until(lambda: _tables_equal(ps, demo.model), timeout=30), _mismatch(ps, demo.model)
        # Now with the dense weights frozen and no export: what changes comes by Kafka only.
        demo.model.freeze_dense()
        demo.model.fit(max_iter=15, display=1000, eval_interval=0,
                       update_source=kafka_broker.bootstrap, publish_interval=10)  # fmt: skip
        assert sorted(p.name for p in (repo / "dlrm").iterdir()) == ["1", "2", "3"]
        moved = want
        want = _trainer_predict(demo.model, des, cat)
        assert np.abs(want - moved).max() > 1e-4
        assert until(
            lambda: np.abs(_served_predict(server.http_url, des, cat) - want).max() <= 1e-5,
            timeout=30,
        ), np.abs(_served_predict(server.http_url, des, cat) - want).max()
        assert until(lambda: _tables_equal(ps, demo.model), timeout=30), _mismatch(ps, demo.model)
        applied = [c for c in loader.update_consumers if c.role == "apply"]
        assert all(c.stats.messages >= 1 for c in applied)
        fresh = applied[0].status().freshness
        assert fresh["count"] >= 1 and fresh["buckets"][-1][1] == fresh["count"]
        assert until(lambda: _update_metrics_hold(server.http_url), timeout=10)


def _update_metrics_hold(url) -> bool:
    """/metrics has the update freshness, no waiting partition, no outage and no lag, for the
    applying consumers of both tiers (lag is measured once a second)."""
    metrics = urllib.request.urlopen(f"http://{url}/metrics").read().decode()
    series = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
              for line in metrics.splitlines() if line and not line.startswith("#")}  # fmt: skip
    for tier in ("volatile:hash_map", "persistent:rocks_db"):
        lags = [v for k, v in series.items() if k.startswith("tierserve_update_consumer_lag{")
                and f'tier="{tier}"' in k and 'role="apply"' in k]  # fmt: skip
        if not (
            series[f'tierserve_update_freshness_seconds_count{{tier="{tier}"}}'] >= 1
            and series[f'tierserve_update_partitions_waiting{{tier="{tier}"}}'] == 0
            and series[f'tierserve_update_kafka_down{{tier="{tier}"}}'] == 0
            and lags
            and max(lags) == 0
        ):
            return False
    return True


def test_updates_survive_a_server_restart(tmp_path, kafka_broker):
    # Before: a restarted server reloaded the version's files over both tiers, its consumers
    # resumed after their commit, and every update applied before the restart was gone.
    demo, repo = _repository(tmp_path, kafka_broker, seed=12)
    loader = RepositoryLoader()
    with _server(repo, loader):
        demo.model.fit(max_iter=20, display=1000, eval_interval=0,
                       update_source=kafka_broker.bootstrap, publish_interval=10)  # fmt: skip
        assert until(lambda: _tables_equal(loader.parameter_server, demo.model), timeout=30), \
            _mismatch(loader.parameter_server, demo.model)  # fmt: skip
    des, cat = _rows(demo.model, 1)
    loader = RepositoryLoader()  # the same replica id (one process): its groups resume
    with _server(repo, loader) as server:
        ps = loader.parameter_server
        assert until(lambda: _tables_equal(ps, demo.model), timeout=30), _mismatch(ps, demo.model)
        # The dense weights are version 1's: compare what the tables feed, not predictions.
        got = ps.lookup("dlrm", TABLE, cat.reshape(-1))
        table = demo.model.tables[0].export()
        index = {k: i for i, k in enumerate(table.keys.tolist())}
        rows = [index[k] for k in cat.reshape(-1).tolist() if k in index]
        assert rows  # the sample keys were trained
        served = {k: got[i] for i, k in enumerate(cat.reshape(-1).tolist())}
        for k, i in zip([k for k in cat.reshape(-1).tolist() if k in index], rows):
            np.testing.assert_array_equal(served[k], table.embeddings[i])
        _served_predict(server.http_url, des, cat)  # and it serves


def test_nothing_is_lost_when_the_broker_restarts_mid_stream(tmp_path, kafka_broker):
    demo, repo = _repository(tmp_path, kafka_broker, seed=13)
    loader = RepositoryLoader()
    with _server(repo, loader):
        demo.model.fit(max_iter=10, display=1000, eval_interval=0,
                       update_source=kafka_broker.bootstrap, publish_interval=5)  # fmt: skip
        kafka_broker.stop()
        try:
            # Training goes on while the broker is away: publishes queue in the producer.
            from tierserve.trainer.online import UpdatePublisher

            publisher = UpdatePublisher(kafka_broker.bootstrap)
            for _ in range(3):
                for _ in range(5):
                    demo.model.train()
                demo.model.publish_updates(publisher)
        finally:
            kafka_broker.start()
        publisher.close()  # delivered once the broker is back
        ps = loader.parameter_server
        assert until(lambda: _tables_equal(ps, demo.model), timeout=60), _mismatch(ps, demo.model)
