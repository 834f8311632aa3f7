"""A custom ``model_fn`` written in the functional API: gradients through what it built agree
with finite differences, a training step applies them, metrics agree with independent
computations, and bad input is refused naming the column."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.server.errors import http_status
from tierserve.trainer import estimator
from tierserve.trainer import feature_column as fc
from tierserve.trainer.estimator import layers, losses, metrics, train

RNG = np.random.default_rng(3)
B = 16
FEATURES = {
    "x": RNG.normal(size=(B, 3)).astype(np.float32),
    "id": RNG.integers(0, 10, size=B),
    "h": RNG.choice(["p", "q", "r", "s"], size=B),
    "tags": [list(RNG.choice(["t1", "t2", "t3"], size=RNG.integers(0, 3))) for _ in range(B)],
}
LABELS = (RNG.random(B) < 0.4).astype(np.float32)


def model_fn(features, labels, mode, params):
    cols = [
        fc.numeric_column("x", shape=3),
        fc.embedding_column(fc.categorical_column_with_identity("id", 10), 4),
        fc.embedding_column(fc.categorical_column_with_vocabulary_list(
            "tags", ["t1", "t2", "t3"]), 4, combiner="sum"),
        fc.indicator_column(fc.categorical_column_with_hash_bucket("h", 5)),
    ]
    net = fc.input_layer(features, cols)
    net = layers.dense(net, 6, activation="tanh")
    net = layers.dense(net, 5, activation=layers.relu)
    logits = layers.dense(net, 1, name="logits")
    p = layers.sigmoid(logits)
    predictions = {"p": p, "logits": logits}
    if mode == estimator.ModeKeys.PREDICT:
        return estimator.EstimatorSpec(mode, predictions=predictions)
    loss = losses.sigmoid_cross_entropy(labels, logits) + 0.5 * losses.mean_squared_error(
        labels, p)
    train_op = train.GradientDescentOptimizer(params["lr"]).minimize(
        loss, global_step=train.get_global_step())
    return estimator.EstimatorSpec(
        mode, predictions=predictions, loss=loss, train_op=train_op,
        eval_metric_ops={"auc": metrics.auc(labels, p), "acc": metrics.accuracy(labels, p),
                         "mean_p": metrics.mean(p)})


def make(tmp_path, lr=0.1):
    return estimator.Estimator(model_fn, str(tmp_path), params={"lr": lr},
                               config=estimator.RunConfig(save_summary_steps=0))


def _program(est):
    est.train(lambda: (dict(FEATURES), LABELS), steps=1)  # builds and initialises
    return next(p for k, p in est._programs.items() if k[0] == estimator.ModeKeys.TRAIN)


def _loss64(prog, tensors, params):
    t = {k: np.asarray(v, np.float64) for k, v in tensors.items()}
    prog.network.forward(np, t, params, prog.states, True)
    return sum(s * float(t[k]) for k, s in prog.loss_scales.items()), t


def test_gradients_match_finite_differences(tmp_path):
    prog = _program(make(tmp_path))
    tensors, _, _ = prog.feed(dict(FEATURES), LABELS, training=False)
    params = [[np.asarray(p, np.float64).copy() for p in ps] for ps in prog.params]
    t = {k: np.asarray(v, np.float64) for k, v in tensors.items()}
    ctxs = prog.network.forward(np, t, params, prog.states, True)
    grads, input_grads = prog.network.backward(np, ctxs, params, prog.loss_scales)
    eps = 1e-6
    checked = 0
    for i, ps in enumerate(params):
        for j, p in enumerate(ps):
            for idx in list(np.ndindex(p.shape))[:6]:
                old = p[idx]
                p[idx] = old + eps
                up, _ = _loss64(prog, tensors, params)
                p[idx] = old - eps
                down, _ = _loss64(prog, tensors, params)
                p[idx] = old
                numeric = (up - down) / (2 * eps)
                assert grads[i][j][idx] == pytest.approx(numeric, rel=1e-5, abs=1e-9)
                checked += 1
    assert checked >= 25
    # gradients reaching the embedding tables' outputs (what the tables' optimizers apply)
    assert set(input_grads) == {g.table for g in prog.graph.groups}
    for name, g in input_grads.items():
        base = np.asarray(tensors[name], np.float64)
        for idx in [(0, 0, 0), (3, 0, 2), (B - 1, 0, 3)]:
            for sign in (1, -1):
                shifted = dict(tensors)
                moved = base.copy()
                moved[idx] += sign * eps
                shifted[name] = moved
                if sign == 1:
                    up, _ = _loss64(prog, shifted, params)
                else:
                    down, _ = _loss64(prog, shifted, params)
            assert g[idx] == pytest.approx((up - down) / (2 * eps), rel=1e-5, abs=1e-9)


def test_a_training_step_applies_the_gradients(tmp_path):
    est = make(tmp_path, lr=0.5)
    prog = _program(est)
    before = {n: np.array(a) for names, arrays in zip(prog.param_names, prog.params)
              for n, a in zip(names, arrays)}
    id_table = next(g for g in prog.graph.groups if g.columns[0].name == "id")
    table = prog.store.tables[id_table.table]
    rows_before = dict(zip(table.keys.tolist(), np.array(table.values)))
    tensors, _, _ = prog.feed(dict(FEATURES), LABELS, training=False)
    ctxs = prog.network.forward(np, dict(tensors), prog.params, prog.states, True)
    grads, input_grads = prog.network.backward(np, ctxs, prog.params, prog.loss_scales)
    est.train(lambda: (dict(FEATURES), LABELS), steps=1)
    for i, names in enumerate(prog.param_names):
        for j, n in enumerate(names):
            np.testing.assert_allclose(est.get_variable_value(n), before[n] - 0.5 * grads[i][j],
                                       rtol=1e-5, atol=1e-6, err_msg=n)
    # the id table: each row moves by -lr * the gradient summed over the examples holding it
    g = input_grads[id_table.table][:, 0, :]
    ids = FEATURES["id"]
    after = dict(zip(table.keys.tolist(), np.array(prog.store.tables[id_table.table].values)))
    for key in set(ids.tolist()):
        expected = rows_before[key] - 0.5 * g[ids == key].sum(axis=0)
        np.testing.assert_allclose(after[key], expected, rtol=1e-5, atol=1e-6)


def _pairwise_auc(y, p):
    pos, neg = p[y == 1], p[y == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return wins / (len(pos) * len(neg))


def test_evaluate_and_predict(tmp_path):
    est = make(tmp_path)
    est.train(lambda: (dict(FEATURES), LABELS), steps=20)
    result = est.evaluate(lambda: (dict(FEATURES), LABELS))
    preds = list(est.predict(lambda: dict(FEATURES)))
    assert len(preds) == B and set(preds[0]) == {"p", "logits"}
    p = np.array([d["p"][0] for d in preds])
    assert result["auc"] == pytest.approx(_pairwise_auc(LABELS, p), abs=1e-9)
    assert result["acc"] == pytest.approx(np.mean((p >= 0.5) == (LABELS == 1)))
    assert result["mean_p"] == pytest.approx(p.mean(), rel=1e-6)
    bce = np.mean(np.logaddexp(0, [d["logits"][0] for d in preds])
                  - LABELS * [d["logits"][0] for d in preds])
    assert result["loss"] == pytest.approx(bce + 0.5 * np.mean((p - LABELS) ** 2), rel=1e-5)
    assert result["global_step"] == 20
    only = list(est.predict(lambda: dict(FEATURES), predict_keys=["p"]))
    assert set(only[0]) == {"p"} and only[3]["p"] == preds[3]["p"]
    with pytest.raises(InvalidInputError, match="predict_keys"):
        list(est.predict(lambda: dict(FEATURES), predict_keys=["nope"]))
    names = est.get_variable_names()
    assert {"dense/kernel", "dense_1/bias", "logits/kernel"} <= set(names)
    assert est.get_variable_value("input_layer/id_embedding/embedding_weights").shape == (10, 4)


def test_a_feature_the_input_fn_does_not_provide(tmp_path):
    est = make(tmp_path)
    features = {k: v for k, v in FEATURES.items() if k != "id"}
    with pytest.raises(InvalidInputError, match="'id_embedding' needs feature 'id'") as err:
        est.train(lambda: (features, LABELS), steps=1)
    assert http_status(err.value) == 400
    assert "does not provide" in str(err.value)


def test_labels_of_the_wrong_dtype(tmp_path):
    est = make(tmp_path)
    with pytest.raises(InvalidInputError, match="label 'clicked' has dtype <U"):
        est.train(lambda: (dict(FEATURES), {"clicked": LABELS.astype(str)}), steps=1)
    with pytest.raises(InvalidInputError, match="label 'labels' has dtype"):
        est.train(lambda: (dict(FEATURES), ["yes"] * B), steps=1)
    cls = estimator.LinearClassifier([fc.numeric_column("x", shape=3)], str(tmp_path / "c"))
    with pytest.raises(InvalidInputError, match="label 'y': 2.0 is not a class id"):
        cls.train(lambda: (dict(FEATURES), {"y": LABELS * 2}), steps=1)


def test_ids_outside_an_identity_column(tmp_path):
    est = make(tmp_path)
    features = dict(FEATURES, id=np.full(B, 12))
    with pytest.raises(InvalidInputError, match="'id': id 12 is outside"):
        est.train(lambda: (features, LABELS), steps=1)


def test_model_fn_contract_errors(tmp_path):
    def no_train_op(features, labels, mode):
        net = fc.input_layer(features, [fc.numeric_column("x", shape=3)])
        loss = losses.mean_squared_error(labels, layers.dense(net, 1))
        return estimator.EstimatorSpec(mode, loss=loss)

    with pytest.raises(ConfigError, match="TRAIN mode needs loss and train_op"):
        estimator.Estimator(no_train_op, str(tmp_path)).train(
            lambda: (dict(FEATURES), LABELS), steps=1)
    with pytest.raises(ConfigError, match="inside a model_fn"):
        layers.dense(None, 3)
    with pytest.raises(ConfigError, match="params were given"):
        estimator.Estimator(no_train_op, str(tmp_path / "p"), params={"a": 1}).train(
            lambda: (dict(FEATURES), LABELS), steps=1)


def test_settings_without_a_meaning_here_are_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match="RunConfig\\(session_config=...\\)"):
        estimator.RunConfig(session_config=object())
    with pytest.raises(ConfigError, match="checkpoint_save_graph_def"):
        estimator.RunConfig(checkpoint_save_graph_def=False)
    with pytest.raises(ConfigError, match="loss_reduction 'none' is not supported"):
        estimator.LinearRegressor([fc.numeric_column("x")], loss_reduction="none")
    with pytest.raises(ConfigError, match="DenseFeatures\\(trainable=False\\)"):
        fc.DenseFeatures([fc.numeric_column("x")], trainable=False)
    est = make(tmp_path)
    est.train(lambda: (dict(FEATURES), LABELS), steps=1)
    with pytest.raises(ConfigError, match="as_text and experimental_mode"):
        est.export_saved_model(str(tmp_path / "e"), lambda: None, as_text=True)
