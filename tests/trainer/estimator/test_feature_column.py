"""Feature columns against independent references: what each column computes from raw
values, pooled embeddings, shared tables, max_norm, and the errors that name the column."""

from __future__ import annotations

import bisect

import numpy as np
import pytest

from tierserve.core.errors import ConfigError, InvalidInputError
from tierserve.trainer import estimator
from tierserve.trainer import feature_column as fc


def dense_of(columns, features, tmp_path, **options):
    """The DenseFeatures output of ``columns`` for ``features`` (a predict-only model)."""
    def model_fn(features, labels, mode):
        return estimator.EstimatorSpec(
            mode, predictions=fc.DenseFeatures(columns, **options)(features))

    est = estimator.Estimator(model_fn, str(tmp_path))
    return next(est.predict(lambda: features, yield_single_examples=False))


def test_categorical_ids_equal_python_references():
    f = {"s": np.array(["b", "zz", "a", "", "c"]), "n": np.array([3, 0, 9, 2, -1]),
         "x": np.array([-1.0, 0.0, 0.5, 2.0, 7.0])}
    vocab = fc.categorical_column_with_vocabulary_list("s", ["a", "b", "c"])
    ids = vocab.ids(f)  # "zz" and "" have no id (TensorFlow's default_value -1)
    assert ids.values.tolist() == [1, 0, 2] and ids.offsets.tolist() == [0, 1, 1, 2, 2, 3]
    oov = fc.categorical_column_with_vocabulary_list("s", ["a", "b", "c"], num_oov_buckets=4)
    fp = {v: int(h) for v, h in zip(["b", "zz", "a", "c"],
                                    fc.fingerprint(np.array(["b", "zz", "a", "c"])))}
    assert oov.ids(f).values.tolist() == [1, 3 + fp["zz"] % 4, 0, 2]
    hashed = fc.categorical_column_with_hash_bucket("s", 1000)  # "" is missing: no id
    assert hashed.ids(f).values.tolist() == [fp[v] % 1000 for v in ["b", "zz", "a", "c"]]
    ident = fc.categorical_column_with_identity("n", 5, default_value=4)
    assert ident.ids(f).values.tolist() == [3, 0, 4, 2]  # 9 -> default; -1 missing
    ints = fc.categorical_column_with_vocabulary_list("n", [9, 3])
    assert ints.ids(f).values.tolist() == [1, 0]
    bounds = [0.0, 1.0, 5.0]
    bucket = fc.bucketized_column(fc.numeric_column("x"), bounds)
    assert bucket.ids(f).values.tolist() == [bisect.bisect_right(bounds, v) for v in f["x"]]
    one_hot = bucket.dense(f)
    assert one_hot.shape == (5, 4) and one_hot.argmax(axis=1).tolist() == [0, 1, 1, 2, 3]
    crossed = fc.crossed_column(["s", bucket], 50)
    same = crossed.ids({"s": np.array(["a", "a", "b"]), "x": np.array([0.5, 0.7, 0.5])})
    assert same.values[0] == same.values[1] != same.values[2]
    assert all(0 <= v < 50 for v in same.values)


def test_numeric_and_indicator_columns(tmp_path):
    f = {"x": np.array([[1.0, np.nan], [3.0, 4.0]]), "t": [["a", "b", "a"], []]}
    num = fc.numeric_column("x", shape=2, default_value=-1.0, normalizer_fn=lambda v: v * 10)
    ind = fc.indicator_column(fc.categorical_column_with_vocabulary_list("t", ["a", "b", "c"]))
    out = dense_of([num, ind], f, tmp_path)
    # sorted by name: t_indicator (counts per id) then x
    np.testing.assert_array_equal(out, [[2, 1, 0, 10, -10], [0, 0, 0, 30, 40]])
    with pytest.raises(InvalidInputError, match="numeric_column 'x': feature 'x' must be "
                                                "numeric"):
        num.dense({"x": np.array(["a", "b"])})


def _init(shape):
    n, d = shape
    return np.arange(n * d, dtype=np.float32).reshape(n, d) / 10.0


def test_embedding_pooling_weighted_and_shared(tmp_path):
    cat = fc.categorical_column_with_identity("ids", 5)
    f = {"ids": [[1, 3], [4], []], "w": [[2.0, 0.5], [3.0], []], "other": [2, 2, 0]}
    mean = fc.embedding_column(cat, 2, combiner="mean", initializer=_init)
    table = _init((5, 2))
    out = dense_of([mean], f, tmp_path / "mean")
    np.testing.assert_allclose(out, [(table[1] + table[3]) / 2, table[4], [0, 0]])
    weighted = fc.embedding_column(fc.weighted_categorical_column(cat, "w"), 2,
                                   combiner="sum", initializer=_init)
    out = dense_of([weighted], f, tmp_path / "weighted")
    np.testing.assert_allclose(out, [2 * table[1] + 0.5 * table[3], 3 * table[4], [0, 0]])
    a, b = fc.shared_embeddings([cat, fc.categorical_column_with_identity("other", 5)], 2,
                                combiner="sum", initializer=_init)
    out = dense_of([a, b], f, tmp_path / "shared")
    np.testing.assert_allclose(out[:, :2], [table[1] + table[3], table[4], [0, 0]])
    np.testing.assert_allclose(out[:, 2:], [table[2], table[2], table[0]])  # one table
    with pytest.raises(ConfigError, match="combiner 'sqrtn' is not supported"):
        fc.embedding_column(cat, 2, combiner="sqrtn")


def test_max_norm_renormalises_the_rows_training_moves(tmp_path):
    cat = fc.categorical_column_with_identity("id", 20)
    col = fc.embedding_column(cat, 4, max_norm=0.5)
    est = estimator.DNNRegressor([8], [col], model_dir=str(tmp_path),
                                 optimizer=estimator.train.GradientDescentOptimizer(1.0))
    ids = np.arange(20)
    est.train(lambda: ({"id": ids}, ids.astype(np.float32)), steps=3)
    w = est.get_variable_value(
        "dnn/input_from_feature_columns/input_layer/id_embedding/embedding_weights")
    norms = np.linalg.norm(w, axis=1)
    assert norms.max() <= 0.5 + 1e-6 and norms.min() > 0.4  # init norm ~1 was clipped


def test_vocabulary_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("house\napt\nloft\n")
    col = fc.categorical_column_with_vocabulary_file("type", str(path), vocabulary_size=2)
    assert col.num_buckets == 2
    assert col.ids({"type": np.array(["apt", "loft", "house"])}).values.tolist() == [1, 0]
    with pytest.raises(ConfigError, match="'type': cannot read vocabulary_file .*missing.txt"):
        fc.categorical_column_with_vocabulary_file("type", str(tmp_path / "missing.txt"))
    with pytest.raises(ConfigError, match="vocabulary_size 5 but .* has 3 entries"):
        fc.categorical_column_with_vocabulary_file("type", str(path), vocabulary_size=5)


def test_bucketized_column_compares_in_float32_as_tensorflow():
    """TensorFlow's Bucketize op holds boundaries as float32: 0.1000000015 rounds to
    float32(0.1), so float32(0.1) falls in the upper bucket (float64 would put it below)."""
    col = fc.bucketized_column(fc.numeric_column("x"), [0.1000000015])
    assert col.ids({"x": np.array([0.1], np.float32)}).values.tolist() == [1]


def test_dense_features_concatenate_in_tensorflows_order(tmp_path):
    """``DenseFeatures`` sorts its columns by name (``feature_column_v2``'s
    ``_DenseFeaturesHelper``: ``sorted(feature_columns, key=lambda x: x.name)``), a numeric
    column between two embedding columns of one table included."""
    ids_x = fc.categorical_column_with_identity("x", 5)
    ids_z = fc.categorical_column_with_identity("z", 5)
    cols = [fc.embedding_column(ids_z, 2, initializer=_init), fc.numeric_column("y"),
            fc.embedding_column(ids_x, 2, initializer=_init)]
    f = {"x": np.array([1, 4]), "y": np.array([7.0, 8.0]), "z": np.array([2, 3])}
    out = dense_of(cols, f, tmp_path)
    table = _init((5, 2))
    # x_embedding, y, z_embedding
    np.testing.assert_allclose(out, np.concatenate(
        [table[[1, 4]], [[7.0], [8.0]], table[[2, 3]]], axis=1))
