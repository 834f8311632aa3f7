"""tierserve.trainer.tf's ops in model_fn bodies: forward against numpy, gradients against
central finite differences in float64, no gradient through the non-differentiable ones."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.core.errors import ConfigError
from tierserve.model.layers import build_layer
from tierserve.model.network import DenseNetwork
from tierserve.trainer import tf
from tierserve.trainer.graph.tensors import Graph, LabelTensor, building

RNG = np.random.default_rng(7)
B = 6
X = RNG.normal(size=(B, 4)).astype(np.float32)
IDS = np.array([0, 2, 1, 3, 5, -1])  # 5 and -1 fall outside depth 4: all off_value
Y = np.array([0, 1, 2, 1, 0, 2])


def predict(build, features=None, labels=None):
    """The predictions ``build(features)`` makes, computed by an Estimator's PREDICT graph."""
    features = {"x": X, "ids": IDS.astype(np.float32)} if features is None else features

    def model_fn(features, labels, mode):
        return tf.estimator.EstimatorSpec(mode, predictions=build(features))

    est = tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(save_summary_steps=0))
    return next(est.predict(lambda: features, yield_single_examples=False))


def test_forward_matches_numpy():
    def build(f):
        x = tf.feature_column.input_layer(f, [tf.feature_column.numeric_column("x", (4,))])
        ids = tf.squeeze(  # [B, 1] -> [B], as TensorFlow's one_hot sees labels
            tf.feature_column.input_layer(f, [tf.feature_column.numeric_column("ids")]), 1)
        return {
            "argmax": tf.argmax(x, 1), "argmax_last": tf.argmax(x, -1),
            "class_ids": tf.argmax(x, 1)[:, tf.newaxis],
            "one_hot": tf.one_hot(ids, 4, 1, 0), "one_hot_pm": tf.one_hot(ids, 4, 2.0, -1.0),
            "one_hot_col": tf.one_hot(tf.expand_dims(ids, 1), 4),
            "trunc": tf.cast(x * 3.0, tf.int32), "nonzero": tf.cast(x - x, tf.bool),
            "mean1": tf.reduce_mean(x, 1), "sum_keep": tf.reduce_sum(x, axis=1, keepdims=True),
            "col": x[:, 2], "cols": x[:, 1:3], "last": x[..., -1],
            "expand": tf.expand_dims(x, 1), "squeeze": tf.squeeze(tf.expand_dims(x, -1)),
            "reshape": tf.reshape(x, [-1, 2, 2]),
            "affine": 2.0 * x + 1.0, "sub": 1.0 - x / 4.0, "neg": -x,
            "const": tf.constant([1.0, 2.0, 3.0, 4.0]) * x,
        }

    p = predict(build)
    assert p["argmax"].dtype == np.int64 and p["argmax"].tolist() == X.argmax(1).tolist()
    assert p["argmax_last"].tolist() == X.argmax(1).tolist()
    assert p["class_ids"].shape == (B, 1) and p["class_ids"][:, 0].tolist() == X.argmax(1).tolist()
    expect = np.zeros((B, 4))
    for i, k in enumerate(IDS):
        if 0 <= k < 4:
            expect[i, k] = 1
    np.testing.assert_array_equal(p["one_hot"], expect)
    np.testing.assert_array_equal(p["one_hot_pm"], np.where(expect == 1, 2.0, -1.0))
    np.testing.assert_array_equal(p["one_hot_col"], expect[:, None, :])  # [B, 1] -> [B, 1, 4]
    np.testing.assert_array_equal(p["trunc"], np.trunc(X * 3).astype(np.int32))
    assert p["nonzero"].dtype == bool and not p["nonzero"].any()
    np.testing.assert_allclose(p["mean1"], X.mean(1), rtol=1e-6)
    np.testing.assert_allclose(p["sum_keep"], X.sum(1, keepdims=True), rtol=1e-6)
    np.testing.assert_array_equal(p["col"], X[:, 2])
    np.testing.assert_array_equal(p["cols"], X[:, 1:3])
    np.testing.assert_array_equal(p["last"], X[..., -1])
    np.testing.assert_array_equal(p["expand"], X[:, None, :])
    np.testing.assert_array_equal(p["squeeze"], X)
    np.testing.assert_array_equal(p["reshape"], X.reshape(B, 2, 2))
    np.testing.assert_allclose(p["affine"], 2 * X + 1, rtol=1e-6)
    np.testing.assert_allclose(p["sub"], 1 - X / 4, rtol=1e-6)
    np.testing.assert_array_equal(p["neg"], -X)
    np.testing.assert_allclose(p["const"], X * np.array([1, 2, 3, 4]), rtol=1e-6)


def test_variables_broadcast_per_example_and_train():
    """DLRover's estimator-executor model: w * x + b with scalar variables."""
    xs = np.linspace(0, 1, 64).astype(np.float32)

    def model_fn(features, labels, mode):
        w = tf.Variable(0.1, name="w")
        b = tf.get_variable("b", shape=[], initializer=0.5)
        assert tf.get_variable("b") is b  # one variable per name in a model_fn call
        prediction = w * features["x"] + b
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions=prediction)
        loss = tf.losses.mean_squared_error(labels, prediction)
        train_op = tf.train.GradientDescentOptimizer(0.5).minimize(
            loss, global_step=tf.train.get_or_create_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    est = tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(save_summary_steps=0))
    assert next(est.predict(lambda: {"x": xs[:3]}, yield_single_examples=False)).reshape(-1) \
        == pytest.approx(0.1 * xs[:3] + 0.5)
    # one step of gradient descent on mean((w x + b - y)^2), by hand
    y = 3 * xs - 1
    r = 0.1 * xs + 0.5 - y
    w1 = 0.1 - 0.5 * np.mean(2 * r * xs)
    b1 = 0.5 - 0.5 * np.mean(2 * r)
    est.train(lambda: ({"x": xs}, y), steps=1)
    assert est.get_variable_value("w") == pytest.approx(w1, rel=1e-5)
    assert est.get_variable_value("b") == pytest.approx(b1, rel=1e-5)
    est.train(lambda: ({"x": xs}, y), steps=300)
    assert est.get_variable_value("w") == pytest.approx(3, abs=0.05)
    assert est.get_variable_value("b") == pytest.approx(-1, abs=0.05)


# -- gradients ----------------------------------------------------------------------------


def _graph_network(build):
    """The network ``build(x, labels)`` makes over an input [B, 4] and labels [B]."""
    g = Graph("train")
    g.shapes["input:label"] = (1,)
    labels = LabelTensor(g, "input:label", (1,), ())
    with building(g):
        x = tf.feature_column.input_layer(
            {"x": X}, [tf.feature_column.numeric_column("x", (4,))])
        loss = build(x, labels)
    shapes = {"input:dense": (g.dense_width,), "input:label": (1,)}
    net = DenseNetwork(g.layers, shapes, {"input:dense"})
    rng = np.random.default_rng(3)
    params = [[rng.normal(size=s) for s in shapes_] for shapes_ in net.param_shapes()]
    for i, layer in enumerate(net.layers):  # frozen constants keep their values
        for j, name in enumerate(g.param_names.get(layer.name, [])):
            if g.frozen.get(name) is not None:
                params[i][j] = np.broadcast_to(np.asarray(g.frozen[name], float),
                                               params[i][j].shape).copy()
    return net, params, dict(loss.terms)


def _check_gradients(build, labels=Y):
    net, params, scales = _graph_network(build)
    states = [[np.asarray(s, float) for s in st] for st in net.init_state()]
    x = RNG.normal(size=(B, 4))

    def loss_of(xv):
        t = {"input:dense": xv, "input:label": labels.reshape(B, 1).astype(float)}
        net.forward(np, t, params, states, True)
        return sum(s * float(t[k]) for k, s in scales.items())

    t = {"input:dense": x, "input:label": labels.reshape(B, 1).astype(float)}
    ctxs = net.forward(np, t, params, states, True)
    pgrads, igrads = net.backward(np, ctxs, params, scales)
    eps = 1e-6
    for idx in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[idx] += eps
        down[idx] -= eps
        numeric = (loss_of(up) - loss_of(down)) / (2 * eps)
        assert igrads["input:dense"][idx] == pytest.approx(numeric, rel=1e-5, abs=1e-8)
    checked = 0
    for i, ps in enumerate(params):
        for j, p in enumerate(ps):
            for idx in list(np.ndindex(p.shape))[:4]:
                keep = p[idx]
                p[idx] = keep + eps
                up = loss_of(x)
                p[idx] = keep - eps
                down = loss_of(x)
                p[idx] = keep
                assert pgrads[i][j][idx] == pytest.approx((up - down) / (2 * eps), rel=1e-5,
                                                          abs=1e-8)
                checked += 1
    return checked


def test_softmax_cross_entropy_with_one_hot_labels_gradients():
    def build(x, labels):
        logits = tf.layers.dense(x, 3)
        return tf.losses.softmax_cross_entropy(tf.one_hot(labels, 3, 1, 0), logits,
                                               label_smoothing=0.1)

    assert _check_gradients(build) >= 6


def test_broadcast_arithmetic_reductions_and_slices_gradients():
    def build(x, labels):
        w = tf.Variable(np.linspace(0.5, 1.5, 4), name="w")  # [4] against [B, 4]
        s = tf.get_variable("s", shape=[])  # a scalar against [B, 4]
        h = (w * x - s) * x[:, 1:2] + x[:, 0][:, tf.newaxis] / 3.0
        h = tf.reshape(tf.expand_dims(h, 1), [-1, 2, 2])
        m = tf.reduce_mean(h, axis=2) + tf.reduce_sum(h, axis=-1) * 0.5
        logits = tf.reduce_sum(tf.squeeze(tf.expand_dims(m, 2)), axis=1, keepdims=True)
        return tf.reduce_mean(tf.to_float(labels) * logits * logits) + 0.5 * \
            tf.losses.sigmoid_cross_entropy(tf.reshape(tf.to_float(labels), [-1, 1]), logits)

    assert _check_gradients(build) >= 5


def test_reduce_mean_over_the_batch_is_a_loss_whose_gradient_is_the_mean():
    layer = build_layer({"name": "m", "type": "ReduceMeanLoss", "bottom": "x", "top": "m"})
    layer.build([(2, 3)])
    x = RNG.normal(size=(B, 2, 3))
    out, ctx = layer.forward(np, [x], [], [], True)
    assert float(out[0]) == pytest.approx(x.mean())
    (g,), _ = layer.backward(np, [2.0], ctx, [])
    np.testing.assert_allclose(g, np.full(x.shape, 2.0 / x.size))


def test_softmax_cross_entropy_equals_its_formula():
    layer = build_layer({"name": "l", "type": "SoftmaxCrossEntropyLoss", "bottom": ["x", "y"],
                         "top": "l", "label_smoothing": 0.2})
    layer.build([(3,), (3,)])
    x = RNG.normal(size=(B, 3))
    y = np.eye(3)[Y]
    smooth = y * 0.8 + 0.2 / 3
    logp = x - np.log(np.exp(x).sum(1, keepdims=True))
    assert float(layer.forward(np, [x, y], [], [], False)[0][0]) == pytest.approx(
        -(smooth * logp).sum(1).mean())
    np.testing.assert_allclose(layer.predict(np, x), np.exp(logp))


def test_non_differentiable_ops_pass_no_gradient():
    for kind, extra, shape in (("ArgMax", {"axis": 1}, (4,)),
                               ("OneHot", {"depth": 3}, (1,)),
                               ("Cast", {"dtype": "int64"}, (4,)),
                               ("Cast", {"dtype": "bool"}, (4,))):
        layer = build_layer({"name": "a", "type": kind, "bottom": "x", "top": "a", **extra})
        layer.build([shape])
        _, ctx = layer.forward(np, [np.ones((B, *shape))], [], [], True)
        assert layer.backward(np, [np.ones(1)], ctx, [])[0] == [None]
    cast = build_layer({"name": "c", "type": "Cast", "bottom": "x", "top": "c",
                        "dtype": "float32"})
    cast.build([(4,)])
    g = np.ones((B, 4))
    assert cast.backward(np, [g], None, [])[0][0] is g


def test_bad_uses_name_the_op_and_what_works():
    def fails(build, match):
        with pytest.raises(ConfigError, match=match):
            predict(build)

    fails(lambda f: tf.argmax(f["x"]), "argmax: axis 0 is the batch axis")
    fails(lambda f: tf.reduce_sum(f["x"]), "reduce_sum over the whole batch")
    fails(lambda f: tf.reshape(f["x"], [4, -1]), "first dimension .* must be -1")
    fails(lambda f: tf.reshape(f["x"], [-1, 3]), r"cannot become \[-1, 3\]")
    fails(lambda f: tf.one_hot(f["x"], 3, axis=0), "axis=0 is not supported")
    fails(lambda f: f["x"][0], "first index must be ':'")
    fails(lambda f: tf.layers.dense(f["x"], 2) / f["x"], "only division by a number")
    fails(lambda f: tf.add(tf.constant([1.0, 2.0]), tf.constant([1.0, 2.0, 3.0])),
          "neither match nor broadcast")
