"""HybridBackend's names (the document's examples with the import changed), its embedding
options honoured, refused or warned about by name; pre-made classifiers (multi-class, label
vocabulary, example weights); DeepFM and DLRover's adaptor pattern."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import tierserve.trainer.hybrid as hb
from tierserve.core.compat import HugeCTRCompatibilityWarning, reset_warnings
from tierserve.core.errors import ConfigError
from tierserve.trainer import estimator as tf_estimator
from tierserve.trainer import feature_column
from tierserve.trainer.estimator import layers, losses, train

RNG = np.random.default_rng(11)
N = 96
BATCH = {
    "col1": RNG.integers(0, 65535, size=N),
    "col2": RNG.integers(0, 1024, size=N),
}
LABELS = (BATCH["col2"] % 2).astype(np.float32)
lr = 0.1


# HybridBackend's example, as its document writes it (tf.* -> tierserve names)
@hb.function(emb_device="/cpu:0")
def model_fn(features, labels, mode, params):
    batch = features
    column1 = feature_column.embedding_column(
        feature_column.categorical_column_with_identity(
            key="col1",
            num_buckets=65535,
            default_value=0),
        dimension=128)
    column2 = feature_column.embedding_column(
        feature_column.categorical_column_with_identity(
            key="col2",
            num_buckets=1024,
            default_value=1),
        dimension=64)
    features = hb.keras.layers.DenseFeatures([column1, column2])(batch)
    logits = layers.dense(features, 1)
    if mode == tf_estimator.ModeKeys.PREDICT:
        return tf_estimator.EstimatorSpec(mode, predictions=layers.sigmoid(logits))
    losses.sigmoid_cross_entropy(labels, logits)
    loss = losses.get_total_loss()
    opt = train.GradientDescentOptimizer(learning_rate=lr)
    train_op = opt.minimize(loss)
    return tf_estimator.EstimatorSpec(
        mode=mode,
        loss=loss,
        train_op=train_op)


def input_fn():
    return dict(BATCH), LABELS


def test_hybridbackend_train_and_evaluate_every_n_iter(tmp_path):
    model = hb.estimator.Estimator(model_fn=model_fn, model_dir=str(tmp_path))
    train_spec = tf_estimator.TrainSpec(input_fn, max_steps=6)
    eval_spec = tf_estimator.EvalSpec(input_fn, steps=1, throttle_secs=10 ** 6)
    calls = []
    original = model.evaluate

    def evaluate(*args, **kwargs):
        calls.append(model.get_variable_value("global_step"))
        return original(*args, **kwargs)

    model.evaluate = evaluate
    metrics, _ = model.train_and_evaluate(train_spec, eval_spec, eval_every_n_iter=2)
    assert calls == [2, 4, 6] and metrics["global_step"] == 6
    assert sorted(p.name for p in tmp_path.glob("model.ckpt-*")) == [
        "model.ckpt-2.npz", "model.ckpt-4.npz", "model.ckpt-6.npz"]
    names = model.get_variable_names()
    assert "input_layer/col1_embedding/embedding_weights" in names


def test_wraps_an_estimator_class(tmp_path):
    @hb.wraps
    class MyEstimator(tf_estimator.Estimator):
        pass

    estimator = MyEstimator(model_fn=model_fn, model_dir=str(tmp_path / "a"))
    assert hasattr(estimator, "train_and_evaluate")
    estimator.train(input_fn, steps=1)
    wrapped = hb.wraps(MyEstimator)(model_fn=model_fn, model_dir=str(tmp_path / "b"))
    assert isinstance(wrapped, tf_estimator.Estimator)


def test_export_saved_model_with_placeholders(tmp_path):
    est = tf_estimator.Estimator(model_fn, str(tmp_path / "m"))
    est.train(input_fn, steps=3)
    export = tf_estimator.export

    def _on_export():
        inputs = {}
        for f in ["col1", "col2"]:
            inputs[f] = export.placeholder(dtype=np.int64, shape=[None], name=f)
        return export.ServingInputReceiver(inputs, inputs)

    out = est.export_saved_model(str(tmp_path / "repo"), _on_export).decode()
    assert out.endswith("/m/1")
    request = export.encode_request(out, {"col1": BATCH["col1"][:4], "col2": BATCH["col2"][:4]})
    # dimensions 128 and 64: two tables of one slot each, ids as they are
    np.testing.assert_array_equal(request["CATCOLUMN"], np.stack(
        [BATCH["col1"][:4], BATCH["col2"][:4]], axis=1))
    assert request["DES"].shape == (4, 0)
    from tierserve.model.inference_graph import InferenceGraph  # the server's dense forward

    assert InferenceGraph  # importable; the HTTP round trip is test_criteo_export's
    with pytest.raises(ConfigError, match="needs feature .col2., which the serving input receiver does not give"):
        est.export_saved_model(str(tmp_path / "repo"), lambda: export.ServingInputReceiver(
            {"col1": export.placeholder(np.int64, [None])}, {}))


def test_embedding_options_honoured_refused_or_warned(tmp_path, monkeypatch):
    reset_warnings()
    col = feature_column.embedding_column(
        feature_column.categorical_column_with_identity("col2", 1024), 4)

    def build(**options):
        def fn(features, labels, mode):
            net = hb.dense_features(features, [col], **options)
            return tf_estimator.EstimatorSpec(mode, predictions=net)

        return list(tf_estimator.Estimator(fn, str(tmp_path / str(len(options)))).predict(
            lambda: {"col2": BATCH["col2"][:2]}))

    assert len(build(emb_device="/cpu:0", emb_dtype=np.float32)) == 2
    with pytest.raises(ConfigError, match="emb_dtype float16 .*store float32"):
        build(emb_dtype="float16")
    with pytest.raises(ConfigError, match="emb_pad=True"):
        build(emb_pad=True)
    with pytest.raises(ConfigError, match="emb_segment_rank=1"):
        build(emb_segment_rank={"col2_embedding": 1})
    with pytest.raises(ConfigError, match="unknown option.*emb_colour"):
        build(emb_colour=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build(emb_num_groups=4, emb_unique=True)
        monkeypatch.setenv("HB_EMB_BUFFER_SIZE", "1024")
        build(emb_wire_dtype="float32")  # the default: no warning for it
        build()
    messages = [str(w.message) for w in caught if w.category is HugeCTRCompatibilityWarning]
    assert any(m.startswith("emb_num_groups: 4 has no effect") for m in messages)
    assert any(m.startswith("emb_unique:") for m in messages)
    assert any(m.startswith("HB_EMB_BUFFER_SIZE: '1024' has no effect") for m in messages)
    assert not any(m.startswith("emb_wire_dtype") for m in messages)
    try:
        import cupy  # noqa: F401

        has_gpu = True
    except ImportError:
        has_gpu = False
    if not has_gpu:
        with pytest.warns(HugeCTRCompatibilityWarning, match="emb_device: '/gpu:0': no GPU"):
            assert len(build(emb_device="/gpu:0", emb_unique=False)) == 2
    with hb.scope(emb_pad=True), pytest.raises(ConfigError, match="emb_pad"):
        build()


def test_multiclass_label_vocabulary_and_example_weights(tmp_path):
    rng = np.random.default_rng(12)
    x = rng.normal(size=(120, 2)).astype(np.float32)
    names = np.array(["low", "mid", "high"])
    cls = np.digitize(x[:, 0], [-0.5, 0.5])
    weights = np.where(cls == 1, 3.0, 1.0).astype(np.float32)
    features = {"x": x, "w": weights}
    est = tf_estimator.DNNClassifier(
        hidden_units=[8], feature_columns=[feature_column.numeric_column("x", shape=2)],
        n_classes=3, label_vocabulary=["low", "mid", "high"], weight_column="w",
        optimizer=train.AdamOptimizer(0.05), model_dir=str(tmp_path))
    est.train(lambda: (features, names[cls]), steps=150)
    result = est.evaluate(lambda: (features, names[cls]))
    print(f"3-class accuracy {result['accuracy']:.3f}")
    assert result["accuracy"] > 0.85
    preds = list(est.predict(lambda: {"x": x[:5]}))
    assert set(preds[0]) == {"logits", "probabilities", "class_ids", "classes"}
    for p in preds:
        assert p["probabilities"].shape == (3,) and p["probabilities"].sum() == pytest.approx(1)
        assert p["classes"][0] == names[p["class_ids"][0]]
    from tierserve.core.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="'top' is not in the label_vocabulary"):
        est.train(lambda: (features, np.array(["top"] * 120)), steps=1)


def test_deepfm_and_dlrover_adaptor(tmp_path):
    class DeepFMAdaptor(tf_estimator.Estimator):
        """DLRover's adaptor pattern: model_fn wraps a pre-made estimator's _model_fn."""

        def model_fn(self, features, labels, mode, params):
            x = features["x"]
            x_buckets = feature_column.bucketized_column(x, boundaries=[1, 3, 5])
            linear_feature_columns = [x_buckets]
            dnn_feature_columns = [x]
            self.estimator = tf_estimator.DeepFMEstimator(
                linear_feature_columns,
                dnn_feature_columns,
                task=params["task"],
            )
            return self.estimator._model_fn(
                features, labels, mode, self.run_config
            )

    rng = np.random.default_rng(13)
    xs = rng.uniform(0, 6, size=200).astype(np.float32)
    ys = (2 * xs + rng.integers(1, 5, size=200)).astype(np.float32)
    est = DeepFMAdaptor(model_dir=str(tmp_path / "adaptor"), params={"task": "regression"})
    est.train(lambda: ({"x": xs}, ys), steps=200)
    loss = est.evaluate(lambda: ({"x": xs}, ys))["average_loss"]
    print(f"DeepFM adaptor regression: average_loss {loss:.3f}, label variance {np.var(ys):.3f}")
    assert loss < 0.5 * np.var(ys)

    cats = [feature_column.categorical_column_with_identity(k, 50) for k in ("a", "b", "c")]
    deepfm = tf_estimator.DeepFMEstimator(
        cats, [feature_column.embedding_column(c, 4) for c in cats], dnn_hidden_units=[8],
        model_dir=str(tmp_path / "deepfm"))
    data = {k: rng.integers(0, 50, size=200) for k in ("a", "b", "c")}
    y = ((data["a"] % 2) == (data["b"] % 2)).astype(np.float32)  # an interaction
    deepfm.train(lambda: (data, y), steps=150)
    auc = deepfm.evaluate(lambda: (data, y))["auc"]
    print(f"DeepFM interaction AUC {auc:.3f}")
    assert auc > 0.9
    assert any("fm" in layer["name"] for layer in next(
        iter(deepfm._programs.values())).graph.layers)


def test_a_subclass_sets_run_config_before_init_as_dlrover_adaptors_do(tmp_path):
    class Adaptor(tf_estimator.Estimator):
        def __init__(self, model_dir, config=None, params=None):
            self.run_config = config  # DLRover's DeepFMAdaptor, before super().__init__
            self.estimator = None
            super().__init__(self.model_fn, model_dir=model_dir, config=config, params=params)

        def model_fn(self, features, labels, mode, params):
            if self.estimator is None:
                self.estimator = tf_estimator.DeepFMEstimator(
                    [feature_column.numeric_column("x")], [feature_column.numeric_column("x")],
                    task="regression", dnn_hidden_units=[4])
            return self.estimator._model_fn(features, labels, mode, self.run_config)

    config = tf_estimator.RunConfig(save_summary_steps=0, tf_random_seed=3)
    est = Adaptor(str(tmp_path), config=config, params={})
    assert est.run_config is config and est.config.tf_random_seed == 3
    xs = np.linspace(0, 1, 64, dtype=np.float32)
    est.train(lambda: ({"x": xs}, 2 * xs), steps=3)
    assert est.get_variable_value("global_step") == 3
    plain = tf_estimator.Estimator(lambda features, labels, mode: None, str(tmp_path / "p"))
    assert plain.run_config is plain.config  # without a subclass's value: the config
