"""DNNLinearCombinedClassifier (Wide&Deep through feature columns) on the Criteo sample:
first 6,000 rows train, last 2,000 evaluate.  It must reach AUC 0.72, and its export, served
over HTTP by tierserve's server from the export folder as it is, must answer what
``Estimator.predict`` gives."""

from __future__ import annotations

import csv
from collections import Counter

import httpx
import numpy as np
import pytest
from shared_data import CRITEO_SAMPLE, require

from tierserve.trainer import estimator
from tierserve.trainer import feature_column as fc
from tierserve.trainer.estimator import export as tf_export

INTS = [f"I{i}" for i in range(1, 14)]
CATS = [f"C{i}" for i in range(1, 27)]


def _load():
    with open(require(CRITEO_SAMPLE), newline="") as f:
        rows = list(csv.reader(f))
    head, body = rows[0], rows[1:]
    columns = dict(zip(head, zip(*body)))
    data = {"label": np.asarray(columns["label"], dtype=np.float32)}
    for k in INTS:
        x = np.asarray([float(v) if v else 0.0 for v in columns[k]], np.float32)
        data[k] = np.log1p(np.maximum(x, 0))  # the input pipeline's transform
    for k in CATS:
        data[k] = np.asarray(columns[k])
    train = {k: v[:6000] for k, v in data.items()}
    test = {k: v[6000:] for k, v in data.items()}
    return train, test


def _input_fn(data, epochs, batch_size=256, shuffle=True):
    def fn():
        rng = np.random.default_rng(0)
        n = len(data["label"])
        for _ in range(epochs):
            order = rng.permutation(n) if shuffle else np.arange(n)
            for s in range(0, n, batch_size):
                j = order[s : s + batch_size]
                yield {k: v[j] for k, v in data.items() if k != "label"}, data["label"][j]

    return fn


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    train, test = _load()
    # values seen fewer than 10 times in training share the out-of-vocabulary bucket
    cats = []
    for k in CATS:
        counts = Counter(train[k].tolist())
        vocab = sorted(v for v, n in counts.items() if n >= 10 and v != "")
        cats.append(fc.categorical_column_with_vocabulary_list(k, vocab, num_oov_buckets=1))
    nums = [fc.numeric_column(k) for k in INTS]
    model_dir = tmp_path_factory.mktemp("wdl") / "criteo_wdl"
    est = estimator.DNNLinearCombinedClassifier(
        model_dir=str(model_dir),
        linear_feature_columns=cats + nums,
        # TensorFlow's update rules; the default learning rates (0.005 / 0.001) are too
        # small for 48 steps
        linear_optimizer=estimator.train.FtrlOptimizer(0.2),
        dnn_optimizer=estimator.train.Adagrad(0.1),
        dnn_feature_columns=nums + [fc.embedding_column(c, 8) for c in cats],
        dnn_hidden_units=[64, 32],
        config=estimator.RunConfig(save_checkpoints_steps=1000, save_summary_steps=20),
    )
    est.train(_input_fn(train, epochs=2))
    return est, train, test


def test_wide_and_deep_reaches_auc_072_on_criteo(trained):
    est, _, test = trained
    metrics = est.evaluate(_input_fn(test, 1, shuffle=False))
    print(f"Criteo W&D: {metrics}")
    assert metrics["global_step"] == 2 * 24  # 6,000 rows in batches of 256, twice
    assert metrics["auc"] >= 0.72, metrics
    assert 0.3 < metrics["average_loss"] < 0.55
    # the AUC is the trainer's exact AUC over the evaluated predictions
    pred = np.concatenate([p["logistic"] for p in est.predict(_input_fn(test, 1, shuffle=False))])
    from tierserve.trainer.metrics import auc_score

    assert auc_score(test["label"], pred) == pytest.approx(metrics["auc"], abs=1e-9)


def test_export_served_by_tierserve_equals_predict(trained, tmp_path):
    from tierserve.server.app import BackgroundServer
    from tierserve.server.settings import Settings

    est, _, test = trained
    spec = fc.make_parse_example_spec([fc.numeric_column(k) for k in INTS] + [
        fc.categorical_column_with_hash_bucket(k, 2) for k in CATS])
    repo = tmp_path / "repository"
    version = est.export_saved_model(
        str(repo), tf_export.build_parsing_serving_input_receiver_fn(spec))
    version = version.decode()
    assert version.endswith("criteo_wdl/1")
    n = 300
    features = {k: v[:n] for k, v in test.items() if k != "label"}
    expected = np.concatenate(
        [p["logistic"] for p in est.predict(lambda: (features, None))]).reshape(-1)
    inputs = tf_export.encode_request(version, features)
    # empty categorical values are no id (as TensorFlow drops them): rows of 0 or 1 keys per
    # slot, so the keys go flattened with ROWINDEX (per table, n * 26 + 1 row pointers)
    assert inputs["DES"].shape == (n, 13)
    assert inputs["ROWINDEX"].shape == (2 * (n * 26 + 1),)
    assert inputs["CATCOLUMN"].shape == (inputs["ROWINDEX"][n * 26] + inputs["ROWINDEX"][-1],)
    types = {"DES": "FP32", "CATCOLUMN": "INT64", "ROWINDEX": "INT32"}
    body = {"inputs": [{"name": k, "datatype": types[k], "shape": list(v.shape),
                        "data": v.reshape(-1).tolist()} for k, v in inputs.items()]}
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=None,
                              poll_interval_s=0)
    with BackgroundServer(settings) as server:
        r = httpx.post(f"http://{server.http_url}/v2/models/criteo_wdl/infer", json=body,
                       timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()["outputs"][0]
        served = np.asarray(out["data"], dtype=np.float32)
    assert out["name"] == "OUTPUT0" and out["shape"] == [n, 1]
    np.testing.assert_allclose(served, expected, atol=1e-5, rtol=0)
    assert np.std(expected) > 0.01  # not a constant answer
