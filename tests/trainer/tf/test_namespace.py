"""``from tierserve.trainer import tf``: TensorFlow's names reach tierserve's modules, missing
ones name the closest supported, Keras and DeepRec's EmbeddingVariable are refused by name;
the TF models custom_estimator's model_fn (argmax, one_hot, softmax_cross_entropy,
metrics.accuracy, summary.scalar) trains, evaluates and predicts."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tierserve.trainer import data, estimator, feature_column, tf
from tierserve.trainer.summary import read_scalars
from tierserve.trainer.tf import RefusedError, UnsupportedError


def test_namespaces_reach_the_existing_modules():
    from tierserve.trainer.tf.compat import v1

    assert v1 is tf and tf.compat.v1 is tf
    assert tf.estimator.Estimator is estimator.Estimator
    assert tf.estimator.ModeKeys.PREDICT == estimator.ModeKeys.PREDICT
    assert tf.feature_column.numeric_column is feature_column.numeric_column
    assert tf.data.Dataset is data.Dataset and tf.data.make_one_shot_iterator is \
        data.make_one_shot_iterator
    assert tf.compat.v1.data.make_one_shot_iterator is data.make_one_shot_iterator
    assert tf.train.AdagradOptimizer is estimator.train.AdagradOptimizer
    assert tf.train.LoggingTensorHook is estimator.LoggingTensorHook
    assert tf.train.get_global_step is estimator.train.get_global_step
    assert tf.compat.v1.layers.dense is estimator.layers.dense and tf.nn.relu is \
        estimator.layers.relu
    assert tf.losses.softmax_cross_entropy is estimator.losses.softmax_cross_entropy
    assert tf.metrics.accuracy is estimator.metrics.accuracy
    assert tf.errors.OutOfRangeError is data.OutOfRangeError
    assert tf.data.experimental.AUTOTUNE == data.AUTOTUNE


def test_dtypes_compare_and_convert_as_tensorflow_names_them():
    assert tf.float32 == "float32" and tf.float32 == np.float32 and tf.int64 != tf.int32
    assert tf.as_dtype(float) is tf.float32 and tf.as_dtype("int32") is tf.int32
    assert tf.as_dtype(np.dtype("<U3")) is tf.string and tf.string.as_numpy_dtype is np.str_
    assert tf.float32.is_floating and tf.int32.is_integer and not tf.int32.is_floating
    col = tf.feature_column.numeric_column("x", shape=(4,), dtype=tf.float32)
    assert col.dtype == np.float32
    with pytest.raises(Exception, match="not a dtype"):
        tf.as_dtype("complex256x")


def test_missing_names_name_the_closest_supported_ones():
    with pytest.raises(UnsupportedError, match=r"tf\.matmul is not supported.*tf\.layers\.dense"):
        tf.matmul  # noqa: B018
    with pytest.raises(UnsupportedError, match=r"tf\.reduce_max .*tf\.reduce_mean"):
        tf.reduce_max  # noqa: B018
    with pytest.raises(UnsupportedError, match=r"tf\.losses\.log_loss .*sigmoid_cross_entropy"):
        tf.losses.log_loss  # noqa: B018
    with pytest.raises(UnsupportedError, match=r"tf\.train\.AdagradOptimiser .*AdagradOptimizer"):
        tf.train.AdagradOptimiser  # noqa: B018
    assert not hasattr(tf, "no_such_op") and not hasattr(tf.nn, "no_such_op")
    with pytest.raises(RefusedError, match="MonitoredTrainingSession: TF1 sessions"):
        tf.train.MonitoredTrainingSession  # noqa: B018


def test_keras_and_embedding_variables_are_refused_by_name():
    assert tf.keras.layers.DenseFeatures is feature_column.DenseFeatures
    with pytest.raises(RefusedError, match=r"tf\.keras\.layers\.Dense: Keras layers .* "
                                           r"tf\.layers"):
        tf.keras.layers.Dense  # noqa: B018
    with pytest.raises(RefusedError, match=r"tf\.keras\.Sequential: Keras"):
        tf.keras.Sequential  # noqa: B018
    with pytest.raises(RefusedError, match="get_file downloads"):
        tf.keras.utils  # noqa: B018
    with pytest.raises(RefusedError, match=r"tf\.keras\.backend: Keras"):  # the reason
        from tierserve.trainer.tf.keras import backend  # noqa: F401
    for get in (lambda: tf.feature_column.categorical_column_with_embedding,
                lambda: tf.get_embedding_variable, lambda: tf.EmbeddingVariableOption):
        with pytest.raises(RefusedError, match="EmbeddingVariable is not supported.*"
                                               "categorical_column_with_hash_bucket"):
            get()
    with pytest.raises(RefusedError, match="partitioning"):  # the reason, not ImportError
        from tierserve.trainer.tf import partitioned_variables  # noqa: F401


def test_logging_app_and_scopes(capsys):
    assert tf.get_logger() is logging.getLogger("tensorflow")
    old = logging.getLogger("tierserve.trainer").level
    try:
        tf.logging.set_verbosity(tf.logging.INFO)
        assert logging.getLogger("tensorflow").level == logging.INFO
        assert logging.getLogger("tierserve.trainer").level == logging.INFO
    finally:
        logging.getLogger("tierserve.trainer").setLevel(old)
    seen = []
    with pytest.raises(SystemExit) as exc:
        tf.app.run(lambda argv: seen.append(argv) or 3, argv=["prog", "--flag"])
    assert exc.value.code == 3 and seen == [["prog", "--flag"]]


# -- the TF models custom_estimator's model_fn ------------------------------------------------

RNG = np.random.default_rng(11)
CENTERS = np.array([[5.0, 3.4, 1.5, 0.2], [5.9, 2.8, 4.3, 1.3], [6.6, 3.0, 5.6, 2.0]])
NAMES = ["SepalLength", "SepalWidth", "PetalLength", "PetalWidth"]


def iris_like(n):
    y = RNG.integers(0, 3, size=n)
    x = CENTERS[y] + RNG.normal(scale=0.3, size=(n, 4))
    return {k: x[:, i].astype(np.float32) for i, k in enumerate(NAMES)}, y


HOOKS: list = []  # the training hooks model_fn made


def my_model(features, labels, mode, params):
    net = tf.feature_column.input_layer(features, params["feature_columns"])
    for units in params["hidden_units"]:
        net = tf.layers.dense(net, units=units, activation=tf.nn.relu)
    logits = tf.layers.dense(net, params["n_classes"], activation=None)
    predicted_classes = tf.argmax(logits, 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={
            "class_ids": predicted_classes[:, tf.newaxis],
            "probabilities": tf.nn.softmax(logits), "logits": logits})
    onehot_labels = tf.one_hot(labels, 3, 1, 0)
    loss = tf.losses.softmax_cross_entropy(onehot_labels=onehot_labels, logits=logits)
    accuracy = tf.metrics.accuracy(labels=labels, predictions=predicted_classes, name="acc_op")
    tf.summary.scalar("accuracy", accuracy[1])
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss,
                                          eval_metric_ops={"accuracy": accuracy})
    train_op = tf.train.AdagradOptimizer(learning_rate=0.1).minimize(
        loss, global_step=tf.train.get_global_step())
    hook = tf.train.LoggingTensorHook({"ids": predicted_classes, "labels": labels},
                                      every_n_iter=1)
    HOOKS.append(hook)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                      training_hooks=[hook])


def test_custom_estimator_model_fn_trains_evaluates_and_predicts(tmp_path):
    train_x, train_y = iris_like(240)
    test_x, test_y = iris_like(60)
    columns = [tf.feature_column.numeric_column(key=k) for k in NAMES]
    params = {"feature_columns": columns, "hidden_units": [10, 10], "n_classes": 3}
    classifier = tf.estimator.Estimator(
        model_fn=my_model, model_dir=str(tmp_path), params=params,
        config=tf.estimator.RunConfig(save_summary_steps=5, tf_random_seed=1))

    def train_input_fn():
        ds = tf.data.Dataset.from_tensor_slices((train_x, train_y)).shuffle(1000).repeat()
        return ds.batch(32).make_one_shot_iterator().get_next()

    def eval_input_fn(features, labels=None):
        inputs = features if labels is None else (features, labels)
        return tf.data.Dataset.from_tensor_slices(inputs).batch(32) \
            .make_one_shot_iterator().get_next()

    classifier.train(input_fn=train_input_fn, steps=200)
    result = classifier.evaluate(input_fn=lambda: eval_input_fn(test_x, test_y))
    preds = list(classifier.predict(input_fn=lambda: eval_input_fn(test_x)))
    ids = np.array([p["class_ids"][0] for p in preds])
    assert ids.dtype == np.int64 and len(ids) == 60
    probs = np.stack([p["probabilities"] for p in preds])
    np.testing.assert_allclose(probs.sum(1), 1, rtol=1e-5)
    np.testing.assert_array_equal(ids, probs.argmax(1))
    # tf.metrics.accuracy compares argmax ids with the labels exactly
    assert result["accuracy"] == pytest.approx(float((ids == test_y).mean()))
    assert result["accuracy"] > 0.9
    # tf.summary.scalar('accuracy', accuracy[1]): the running accuracy over training steps
    logged = HOOKS[-1].logged
    hits = np.cumsum([float((v["ids"].reshape(-1) == v["labels"].reshape(-1)).sum())
                      for v in logged])
    seen = np.cumsum([v["ids"].size for v in logged])
    written = dict(read_scalars(tmp_path)["accuracy"])
    assert sorted(written) == list(range(5, 201, 5))
    for step in (5, 100, 200):
        assert written[step] == pytest.approx(hits[step - 1] / seen[step - 1], rel=1e-6)
