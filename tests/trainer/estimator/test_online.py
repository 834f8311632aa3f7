"""The Estimator's online-learning hook (tierserve.trainer.estimator.online) against the real
broker and a served model: an Estimator that keeps training with the hook is served as it
predicts, its tables row for row; settings are checked; a broker failure is an error."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from polling import until

from tierserve.core.errors import BackendUnavailableError, ConfigError
from tierserve.trainer import estimator
from tierserve.trainer import feature_column as fc
from tierserve.trainer.estimator import UpdatePublisherHook, export

pytest.importorskip("confluent_kafka")

RNG = np.random.default_rng(15)
N = 512
IDS = 300
F = {"x": RNG.normal(size=N).astype(np.float32), "id": RNG.integers(0, IDS, size=N),
     "k": RNG.choice(["a", "b", "c", "d"], N)}  # fmt: skip
Y = ((F["x"] + (F["id"] % 3 == 0) - 0.5 * (F["k"] == "b")) > 0.3).astype(np.float32)


def _classifier(model_dir) -> estimator.DNNLinearCombinedClassifier:
    ids = fc.categorical_column_with_identity("id", IDS)
    k = fc.categorical_column_with_vocabulary_list("k", ["a", "b", "c", "d"])
    return estimator.DNNLinearCombinedClassifier(
        linear_feature_columns=[ids, k],
        dnn_feature_columns=[fc.numeric_column("x"), fc.embedding_column(ids, 8),
                             fc.embedding_column(k, 4)],
        dnn_hidden_units=[16, 8], model_dir=str(model_dir),
        config=estimator.RunConfig(tf_random_seed=3, log_step_count_steps=None),
    )  # fmt: skip


def _input_fn(batch: int = 64, seed: int = 0):
    rng = np.random.default_rng(seed)

    def fn():
        while True:  # a different batch each step: different rows change
            pick = rng.integers(0, N, batch)
            yield {k: v[pick] for k, v in F.items()}, Y[pick]

    return fn


RECEIVER = export.build_raw_serving_input_receiver_fn({
    "x": export.placeholder(np.float32, [None]), "id": export.placeholder(np.int64, [None]),
    "k": export.placeholder(str, [None])})  # fmt: skip


def test_settings_are_checked():
    for kwargs, message in [
        ({"publish_steps": 0}, "publish_steps must be >= 1"),
        ({"export_steps": 5}, "export_dir_base and export_steps together"),
        ({"export_dir_base": "x", "export_steps": 5}, "needs a serving_input_receiver_fn"),
        ({"export_dir_base": "x", "export_steps": 0, "serving_input_receiver_fn": RECEIVER},
         "export_steps must be >= 1"),
    ]:
        with pytest.raises(ConfigError, match=message):
            UpdatePublisherHook("127.0.0.1:1", **kwargs)
    with pytest.raises(ConfigError, match="update_source must name Kafka brokers"):
        UpdatePublisherHook(None)


def test_a_broker_failure_is_logged_and_raised_by_the_next_train(tmp_path, caplog):
    from tierserve.ps.kafka_producer import UpdateProducer

    caplog.set_level(logging.ERROR, logger="tierserve.trainer")
    # No broker listens on port 1: each message fails after message.timeout.ms.
    hook = UpdatePublisherHook(UpdateProducer("127.0.0.1:1", **{"message.timeout.ms": 300}),
                               publish_steps=2)  # fmt: skip
    model = _classifier(tmp_path / "m")
    try:
        model.train(_input_fn(), hooks=[hook], steps=4)
        assert any("publishing failed" in r.getMessage() for r in caplog.records)
        with pytest.raises(BackendUnavailableError, match="online update publishes failed"):
            model.train(_input_fn(), hooks=[hook], steps=1)
    finally:
        hook.close(timeout=1)


def _encode(version: str, rows: dict) -> tuple[np.ndarray, np.ndarray]:
    request = export.encode_request(version, rows)
    return request["DES"], request["CATCOLUMN"]


def _served(url: str, model: str, des: np.ndarray, cat: np.ndarray) -> np.ndarray:
    import tritonclient.http as th

    client = th.InferenceServerClient(url)
    a = th.InferInput("DES", list(des.shape), "FP32")
    a.set_data_from_numpy(des)
    b = th.InferInput("CATCOLUMN", list(cat.shape), "INT64")
    b.set_data_from_numpy(cat)
    return client.infer(model, [a, b]).as_numpy("OUTPUT0").reshape(-1)


def _predicted(model, rows: dict) -> np.ndarray:
    return np.array([p["logistic"][0] for p in model.predict(lambda: rows)], np.float32)


def _tables_equal(ps, model, name: str) -> bool:
    """The served tier holds each of the Estimator's tables row for row."""
    for table_name, table in model._store.tables.items():  # noqa: SLF001
        keys, values = table.keys, table.values
        got = ps.lookup(name, table_name, keys)
        if not np.array_equal(got, values):
            return False
    return True


@pytest.mark.kafka
def test_an_estimator_trained_while_served_is_served_as_it_predicts(tmp_path, kafka_broker):
    from tierserve.server.app import BackgroundServer
    from tierserve.server.runtime.loader import RepositoryLoader
    from tierserve.server.settings import Settings

    model = _classifier(tmp_path / "ctr")
    model.train(_input_fn(seed=1), steps=20)
    repo = tmp_path / "repo"
    first = model.export_saved_model(str(repo), RECEIVER).decode()
    config = json.loads((repo / "ps.json").read_text())
    config["update_source"] = {"type": "kafka_message_queue", "brokers": kafka_broker.bootstrap,
                               "poll_timeout_ms": 100}  # fmt: skip
    config["volatile_db"]["update_filters"] = ["ctr"]
    (repo / "ps.json").write_text(json.dumps(config))
    pick = RNG.integers(0, N, 48)
    rows = {k: v[pick] for k, v in F.items()}
    des, cat = _encode(first, rows)
    loader = RepositoryLoader()
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=None,
                              poll_interval_s=0.2)  # fmt: skip
    with BackgroundServer(settings, loader=loader) as server:
        before = _served(server.http_url, "ctr", des, cat)
        np.testing.assert_allclose(before, _predicted(model, rows), atol=1e-5)
        # Sparse rows by Kafka every 5 steps, dense weights by a version every 20 (and both
        # at the end): versions 2 and 3 at steps 40 and 60, 4 at 65.
        hook = UpdatePublisherHook(kafka_broker.bootstrap, publish_steps=5,
                                   export_dir_base=repo, export_steps=20,
                                   serving_input_receiver_fn=RECEIVER)  # fmt: skip
        try:
            model.train(_input_fn(seed=2), hooks=[hook], steps=45)
            assert hook.name == "ctr"
            assert [v.rsplit("/", 1)[1] for v in hook.versions] == ["2", "3", "4"]
            want = _predicted(model, rows)
            assert np.abs(want - before).max() > 1e-3  # the model did move
            assert until(lambda: np.abs(_served(server.http_url, "ctr", des, cat) - want).max()
                         <= 1e-5, timeout=30), \
                np.abs(_served(server.http_url, "ctr", des, cat) - want).max()  # fmt: skip
            ps = loader.parameter_server
            assert until(lambda: _tables_equal(ps, model, "ctr"), timeout=10)
            # Publishing alone (no export): what the served tables get comes by Kafka only.
            publish_only = UpdatePublisherHook(hook.publisher, publish_steps=5)
            model.train(_input_fn(seed=3), hooks=[publish_only], steps=12)
            assert sorted(p.name for p in (repo / "ctr").iterdir()) == ["1", "2", "3", "4"]
            assert until(lambda: _tables_equal(ps, model, "ctr"), timeout=30)
            applied = [c for c in loader.update_consumers if c.role == "apply"]
            assert applied and all(c.stats.messages >= 1 and c.stats.rejected == 0
                                   for c in applied)  # fmt: skip
        finally:
            hook.close()
