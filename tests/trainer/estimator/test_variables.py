"""The Estimator's variable store: setting variables by their TensorFlow names (what the
TensorFlow peer benchmark copies a TF checkpoint in with), and what an id no training step
looked up reads in evaluation and prediction."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.core.errors import ConfigError
from tierserve.trainer import estimator
from tierserve.trainer import feature_column as fc
from tierserve.trainer.estimator.spec import ModeKeys
from tierserve.trainer.estimator.tables import ColumnTable

EMB = "dnn/input_from_feature_columns/input_layer/id_embedding/embedding_weights"


def _model(tmp_path):
    ids = fc.categorical_column_with_identity("id", 6)
    return estimator.DNNRegressor([3], [fc.embedding_column(ids, 2)], str(tmp_path),
                                  optimizer=estimator.train.GradientDescentOptimizer(0.1))


def _predict(est, ids):
    return np.array([p["predictions"][0] for p in est.predict(lambda: {"id": np.array(ids)})])


def test_assign_sets_dense_variables_and_column_weights(tmp_path):
    est = _model(tmp_path)
    feats, labels = {"id": np.array([0, 1])}, np.array([1.0, 2.0], np.float32)
    est._program(ModeKeys.TRAIN, feats, est._labels_for(labels))
    store = est._store
    table = np.arange(12, dtype=np.float32).reshape(6, 2) / 10
    store.assign(EMB, table)
    store.assign("dnn/hiddenlayer_0/kernel", np.ones((2, 3), np.float32))
    store.assign("dnn/hiddenlayer_0/bias", np.zeros(3, np.float32))
    store.assign("dnn/logits/kernel", np.ones((3, 1), np.float32))
    store.assign("dnn/logits/bias", np.zeros(1, np.float32))
    np.testing.assert_array_equal(est.get_variable_value(EMB), table)
    # relu(e @ 1) @ 1 = 3 * (e0 + e1) for each id's row e
    np.testing.assert_allclose(_predict(est, [2, 5]), 3 * table[[2, 5]].sum(axis=1), rtol=1e-6)
    with pytest.raises(ConfigError, match="shape \\[3, 2\\], the column has \\[6, 2\\]"):
        store.assign(EMB, table[:3])
    with pytest.raises(ConfigError, match="shape \\[2\\], the variable has \\[3\\]"):
        store.assign("dnn/hiddenlayer_0/bias", np.zeros(2))
    with pytest.raises(ConfigError, match="no variable named 'nope'"):
        store.assign("nope", 1.0)


def test_an_id_never_trained_reads_zeros_or_as_tensorflow_its_initial_vector(tmp_path):
    est = _model(tmp_path)
    est.train(lambda: ({"id": np.array([0, 1])}, np.array([1.0, 2.0], np.float32)), steps=1)
    initial = est.get_variable_value(EMB)[4]  # id 4 was never looked up: its initial vector
    assert np.abs(initial).max() > 0
    kernel = est.get_variable_value("dnn/hiddenlayer_0/kernel")
    bias = est.get_variable_value("dnn/hiddenlayer_0/bias")
    head = est.get_variable_value("dnn/logits/kernel")
    out_bias = est.get_variable_value("dnn/logits/bias")

    def expected(e):
        return float((np.maximum(e @ kernel + bias, 0) @ head + out_bias)[0])

    assert _predict(est, [4])[0] == pytest.approx(expected(np.zeros(2)), rel=1e-5)
    ColumnTable.absent_reads_initial = True
    try:
        assert _predict(est, [4])[0] == pytest.approx(expected(initial), rel=1e-5)
    finally:
        ColumnTable.absent_reads_initial = False
