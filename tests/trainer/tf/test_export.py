"""A model_fn written with tierserve.trainer.tf's ops (variables broadcast per example,
argmax, cast, newaxis) exports, and tierserve's server serves what predict gives: the ops'
layers are built by the server's own layer registry."""

from __future__ import annotations

import httpx
import numpy as np

from tierserve.trainer import tf

RNG = np.random.default_rng(9)
N = 40
X = RNG.normal(size=(N, 4)).astype(np.float32)
K = RNG.integers(0, 5, size=N)
Y = (X[:, 0] > 0).astype(np.int64) + (K > 2)


def model_fn(features, labels, mode, params):
    x = tf.feature_column.input_layer(features, [tf.feature_column.numeric_column("x", (4,))])
    k = tf.feature_column.input_layer(features, [tf.feature_column.embedding_column(
        tf.feature_column.categorical_column_with_identity("k", 5), 2)])  # served: one table
    scale = tf.get_variable("scale", shape=[4], initializer=np.ones(4))
    h = tf.layers.dense(tf.concat([x * scale + tf.Variable(0.5, name="shift"), k], 1), 3)
    probs = tf.nn.softmax(h)
    ids = tf.cast(tf.argmax(h, 1), tf.float32)[:, tf.newaxis]
    served = probs if params["serve"] == "probs" else ids
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(
            mode, predictions={"probs": probs, "ids": ids},
            export_outputs={"serving_default": tf.estimator.export.PredictOutput(served)})
    loss = tf.losses.sparse_softmax_cross_entropy(labels, h)
    return tf.estimator.EstimatorSpec(
        mode, loss=loss, train_op=tf.train.AdagradOptimizer(0.3).minimize(loss))


def test_tf_ops_export_and_serve_as_they_predict(tmp_path):
    from tierserve.server.app import BackgroundServer
    from tierserve.server.settings import Settings

    receiver = tf.estimator.export.build_raw_serving_input_receiver_fn(
        {"x": tf.placeholder(tf.float32, [None, 4]), "k": tf.placeholder(tf.int64, [None])})
    repo = tmp_path / "repo"
    versions, expected = {}, {}
    for serve in ("probs", "ids"):
        est = tf.estimator.Estimator(model_fn, str(tmp_path / serve), params={"serve": serve},
                                     config=tf.estimator.RunConfig(save_summary_steps=0))
        est.train(lambda: ({"x": X, "k": K}, Y), steps=40)
        assert est.get_variable_value("scale").shape == (4,)  # trained, checkpointed by name
        versions[serve] = est.export_saved_model(str(repo), receiver).decode()
        out = next(est.predict(lambda: {"x": X[:8], "k": K[:8]}, yield_single_examples=False))
        expected[serve] = out[serve]
    assert set(np.unique(expected["ids"])) <= {0.0, 1.0, 2.0}
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=None,
                              poll_interval_s=0)
    with BackgroundServer(settings) as server:
        for serve, width in (("probs", 3), ("ids", 1)):
            request = tf.estimator.export.encode_request(versions[serve],
                                                         {"x": X[:8], "k": K[:8]})
            types = {"DES": "FP32", "CATCOLUMN": "INT64", "ROWINDEX": "INT32"}
            body = {"inputs": [{"name": n, "datatype": types[n], "shape": list(a.shape),
                                "data": a.reshape(-1).tolist()} for n, a in request.items()]}
            r = httpx.post(f"http://{server.http_url}/v2/models/{serve}/infer", json=body,
                           timeout=60)
            assert r.status_code == 200, r.text
            got = np.asarray(r.json()["outputs"][0]["data"], np.float32).reshape(8, width)
            np.testing.assert_allclose(got, expected[serve].reshape(8, width), atol=1e-5)
