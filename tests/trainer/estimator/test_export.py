"""Exports served by tierserve's server as written: a regressor with the Estimator's own
layer types (Tanh, MeanSquaredErrorLoss), multi-valued and empty categorical features
(CATCOLUMN with ROWINDEX), and a model with no dense features, in one repository; version
numbering and the repository's ps.json."""

from __future__ import annotations

import json

import httpx
import numpy as np

from tierserve.trainer import estimator
from tierserve.trainer import feature_column as fc
from tierserve.trainer.estimator import export

RNG = np.random.default_rng(5)
N = 64
F = {
    "x": RNG.normal(size=N).astype(np.float32),
    "k": RNG.choice(["a", "b", "c"], N),
    "m": [list(RNG.choice(["u", "v", "w"], RNG.integers(0, 4))) for _ in range(N)],
    "id": RNG.integers(0, 100, size=N),
}
Y = (F["x"] * 2 + (F["k"] == "a")).astype(np.float32)
TYPES = {"DES": "FP32", "CATCOLUMN": "INT64", "ROWINDEX": "INT32"}


def infer(url: str, model: str, inputs: dict) -> np.ndarray:
    body = {"inputs": [{"name": k, "datatype": TYPES[k], "shape": list(a.shape),
                        "data": a.reshape(-1).tolist()} for k, a in inputs.items()]}
    r = httpx.post(f"http://{url}/v2/models/{model}/infer", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["outputs"][0]["data"], dtype=np.float32)


def test_exports_serve_what_predict_gives(tmp_path):
    from tierserve.server.app import BackgroundServer
    from tierserve.server.settings import Settings

    k = fc.categorical_column_with_vocabulary_list("k", ["a", "b", "c"])
    m = fc.categorical_column_with_vocabulary_list("m", ["u", "v", "w"])
    regressor = estimator.DNNRegressor(
        [4], [fc.numeric_column("x"), fc.embedding_column(k, 3), fc.embedding_column(m, 3),
              fc.indicator_column(k)], activation_fn="tanh", model_dir=str(tmp_path / "reg"))
    regressor.train(lambda: (F, Y), steps=30)
    receiver = export.build_raw_serving_input_receiver_fn({
        "x": export.placeholder(np.float32, [None]), "k": export.placeholder(str, [None]),
        "m": export.sparse_placeholder(str)})
    repo = tmp_path / "repo"
    first = regressor.export_saved_model(str(repo), receiver).decode()
    second = regressor.export_saved_model(str(repo), receiver).decode()
    assert (first.rsplit("/", 1)[1], second.rsplit("/", 1)[1]) == ("1", "2")

    ids = fc.embedding_column(fc.categorical_column_with_identity("id", 100), 4)
    only_ids = estimator.DNNClassifier([4], [ids], model_dir=str(tmp_path / "ids"))
    only_ids.train(lambda: ({"id": F["id"]}, (F["id"] % 2).astype(np.float32)), steps=10)
    ids_version = only_ids.export_saved_model(
        str(repo), export.build_parsing_serving_input_receiver_fn(
            fc.make_parse_example_spec([ids]))).decode()

    three = estimator.DNNClassifier([4], [fc.numeric_column("x"), fc.embedding_column(k, 2)],
                                    n_classes=3, model_dir=str(tmp_path / "three"))
    three.train(lambda: ({"x": F["x"], "k": F["k"]}, np.digitize(F["x"], [-0.5, 0.5])),
                steps=10)
    three_version = three.export_saved_model(str(repo), export.build_parsing_serving_input_receiver_fn(
        fc.make_parse_example_spec([fc.numeric_column("x"), k]))).decode()

    config = json.loads((repo / "ps.json").read_text())
    assert [m["model"] for m in config["models"]] == ["reg", "ids", "three"]
    assert config["models"][2]["label_dim"] == 3
    reg_entry = config["models"][0]
    assert reg_entry["embedding_table_names"] == [
        "dnn-input_from_feature_columns-input_layer-k_embedding"]
    assert reg_entry["maxnum_des_feature_per_sample"] == 4  # x + k's one-hot

    n = 12
    sub = {key: F[key][:n] for key in ("x", "k", "m")}
    expected = np.array([p["predictions"][0] for p in regressor.predict(lambda: sub)])
    request = export.encode_request(second, sub)
    assert "ROWINDEX" in request  # m has rows of 0 to 3 values
    # as many ids as rows, but not one per row: still ROWINDEX
    uneven = export.encode_request(second, {"x": F["x"][:2], "k": np.array(["a", "b"]),
                                            "m": [["u", "v"], []]})
    assert uneven["ROWINDEX"].tolist() == [0, 1, 3, 4, 4]
    assert request["CATCOLUMN"].shape == (n + sum(len(v) for v in F["m"][:n]),)
    ids_expected = np.array([p["logistic"][0] for p in only_ids.predict(
        lambda: {"id": F["id"][:n]})])
    ids_request = export.encode_request(ids_version, {"id": F["id"][:n]})
    assert ids_request["DES"].shape == (n, 0)
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=None,
                              poll_interval_s=0)
    with BackgroundServer(settings) as server:
        np.testing.assert_allclose(infer(server.http_url, "reg", request), expected,
                                   atol=1e-5, rtol=0)
        np.testing.assert_allclose(infer(server.http_url, "ids", ids_request), ids_expected,
                                   atol=1e-5, rtol=0)
        probs = np.stack([p["probabilities"] for p in three.predict(
            lambda: {"x": F["x"][:n], "k": F["k"][:n]})])
        served = infer(server.http_url, "three", export.encode_request(
            three_version, {"x": F["x"][:n], "k": F["k"][:n]}))
        np.testing.assert_allclose(served.reshape(n, 3), probs, atol=1e-5, rtol=0)


def test_latest_and_best_exporters(tmp_path):
    k = fc.categorical_column_with_vocabulary_list("k", ["a", "b", "c"])
    est = estimator.LinearRegressor([fc.numeric_column("x"), k], str(tmp_path / "m"))
    receiver = export.build_parsing_serving_input_receiver_fn(
        fc.make_parse_example_spec([fc.numeric_column("x"), k]))
    latest = export.LatestExporter("latest", receiver, exports_to_keep=2)
    seen = []

    def worse(best, current):  # exports only when the loss went up: never, as it falls
        seen.append((best["global_step"], current["global_step"]))
        return current["loss"] > best["loss"]

    best = export.BestExporter("best", receiver, compare_fn=worse)
    metrics, exports = est.train_and_evaluate(
        estimator.TrainSpec(lambda: (F, Y), max_steps=15),
        estimator.EvalSpec(lambda: (F, Y), steps=1, exporters=[latest, best]),
        eval_every_n_iter=5)
    assert metrics["global_step"] == 15
    made = sorted(e.decode().split("/export/")[1] for e in exports)
    assert made == ["best/best/1", "latest/latest/1", "latest/latest/2", "latest/latest/3"]
    assert seen == [(5, 10), (5, 15)]
    kept = sorted(p.name for p in (tmp_path / "m" / "export" / "latest" / "latest").iterdir()
                  if p.name.isdigit())
    assert kept == ["2", "3"]
