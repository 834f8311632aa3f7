"""The Estimator's defaults against TensorFlow 2.15's, each read from TensorFlow's source
(``tensorflow/estimator`` v2.15.0, ``keras-team/tf-keras`` v2.15.0, ``tensorflow/tensorflow``
kernels); the file and symbol are named in each test.  ``bench/estimator/tf_peer.py`` checks
the same against TensorFlow itself (per-step losses equal from TF's initial variables); these
tests need no TensorFlow."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tierserve.core.errors import ConfigError
from tierserve.trainer import estimator
from tierserve.trainer import feature_column as fc
from tierserve.trainer.estimator import train
from tierserve.trainer.estimator.spec import ModeKeys
from tierserve.trainer.optimizers import Optimizer_t, Update_t

RNG = np.random.default_rng(5)
B = 64
FEATURES = {"x": RNG.normal(size=B).astype(np.float32), "id": RNG.integers(0, 40, size=B),
            "s": RNG.choice(["a", "b", "c"], B)}
LABELS = (FEATURES["x"] > 0).astype(np.float32)


def _cols():
    ids = fc.categorical_column_with_identity("id", 40)
    return ids, [fc.numeric_column("x"), fc.embedding_column(ids, 4)]


def _optimizers(est, features=FEATURES, labels=LABELS) -> dict[str, train.Optimizer]:
    """The optimizer of each train op of ``est``'s training program, by variable prefix."""
    prog = est._program(ModeKeys.TRAIN, features, est._labels_for(labels))
    return {(op.var_list or ["*"])[0]: op.optimizer for op in prog.train_ops}


def _hyper(opt: train.Optimizer) -> dict:
    p = opt.params()
    return {"kind": p.optimizer, "lr": opt.lr(0), "beta1": p.beta1, "beta2": p.beta2,
            "epsilon": p.epsilon, "init": p.initial_accu_value, "lambda2": p.lambda2,
            "momentum": p.momentum_factor}


def test_dnn_named_optimizers_keep_their_keras_default_learning_rate(tmp_path):
    """``canned/dnn.py`` ``dnn_model_fn_v2``: ``optimizers.get_optimizer_instance_v2(optimizer)``
    (no learning rate), so a name builds ``tf.keras.optimizers.legacy.<name>()``: Adagrad
    0.001 with ``initial_accumulator_value=0.1, epsilon=1e-7``, Adam 0.001 with
    ``epsilon=1e-7``, SGD 0.01 (``tf_keras/optimizers/legacy/{adagrad,adam,
    gradient_descent}.py`` ``__init__``); the default optimizer is ``'Adagrad'``
    (``DNNClassifierV2.__init__``).  tierserve used 0.05 (V1's ``_LEARNING_RATE``)."""
    _, cols = _cols()
    got = _hyper(_optimizers(estimator.DNNClassifier([8], cols, str(tmp_path / "a")))["dnn/"])
    assert got["kind"] == Optimizer_t.AdaGrad
    assert (got["lr"], got["init"], got["epsilon"]) == pytest.approx((0.001, 0.1, 1e-7))
    adam = _hyper(_optimizers(estimator.DNNClassifier(
        [8], cols, str(tmp_path / "b"), optimizer="Adam"))["dnn/"])
    assert adam["kind"] == Optimizer_t.Adam
    assert (adam["lr"], adam["beta1"], adam["beta2"], adam["epsilon"]) == pytest.approx(
        (0.001, 0.9, 0.999, 1e-7))
    sgd = _hyper(_optimizers(estimator.DNNRegressor(
        [8], cols, str(tmp_path / "c"), optimizer="SGD"))["dnn/"])
    assert (sgd["kind"], sgd["lr"]) == (Optimizer_t.SGD, pytest.approx(0.01))
    ftrl = _hyper(_optimizers(estimator.DNNClassifier(
        [8], cols, str(tmp_path / "d"), optimizer="Ftrl"))["dnn/"])
    assert (ftrl["kind"], ftrl["lr"], ftrl["init"]) == (Optimizer_t.Ftrl, pytest.approx(0.001),
                                                        pytest.approx(0.1))


def test_linear_learning_rates(tmp_path):
    """``canned/linear.py``: ``_LEARNING_RATE = 0.2``; ``_linear_model_fn_v2`` builds
    ``get_optimizer_instance_v2(optimizer or _get_default_optimizer_v2(feature_columns),
    learning_rate=_LEARNING_RATE)``, so the default ``'Ftrl'`` runs at 0.2 and only
    ``optimizer=None`` gives ``min(0.2, 1/sqrt(#columns))``; keras' Ftrl starts its
    accumulator at 0.1 (``tf_keras/optimizers/legacy/ftrl.py``)."""
    cols = [fc.numeric_column("x")] + [fc.numeric_column(f"f{i}") for i in range(99)]
    feats = {**FEATURES, **{f"f{i}": FEATURES["x"] for i in range(99)}}
    default = _hyper(_optimizers(estimator.LinearClassifier(cols, str(tmp_path / "a")),
                                 feats)["linear/"])
    assert (default["kind"], default["lr"], default["init"]) == (
        Optimizer_t.Ftrl, pytest.approx(0.2), pytest.approx(0.1))
    none = _optimizers(estimator.LinearClassifier(cols, str(tmp_path / "b"), optimizer=None),
                       feats)["linear/"]
    assert none.lr(0) == pytest.approx(min(0.2, 1 / math.sqrt(100)))
    adam = _optimizers(estimator.LinearRegressor(cols, str(tmp_path / "c"), optimizer="Adam"),
                       feats)["linear/"]
    assert (type(adam), adam.lr(0)) == (train.Adam, pytest.approx(0.2))


def test_combined_learning_rates(tmp_path):
    """``canned/dnn_linear_combined.py``: ``_DNN_LEARNING_RATE = 0.001``,
    ``_LINEAR_LEARNING_RATE = 0.005`` and ``_linear_learning_rate(n) = min(0.005,
    1/sqrt(n))``, given to ``get_optimizer_instance_v2`` by
    ``_dnn_linear_combined_model_fn_v2`` for named optimizers; defaults ``'Ftrl'`` and
    ``'Adagrad'``.  tierserve used min(0.2, 1/sqrt(n)) and 0.05."""
    ids, cols = _cols()
    est = estimator.DNNLinearCombinedClassifier(
        str(tmp_path / "a"), linear_feature_columns=[ids, fc.numeric_column("x")],
        dnn_feature_columns=cols, dnn_hidden_units=[8])
    ops = _optimizers(est)
    assert (type(ops["linear/"]), ops["linear/"].lr(0)) == (train.Ftrl, pytest.approx(0.005))
    assert (type(ops["dnn/"]), ops["dnn/"].lr(0)) == (train.Adagrad, pytest.approx(0.001))
    est = estimator.DNNLinearCombinedRegressor(
        str(tmp_path / "b"), linear_feature_columns=[ids], linear_optimizer="Adam",
        dnn_feature_columns=cols, dnn_optimizer="Adam", dnn_hidden_units=[8])
    ops = _optimizers(est)
    assert ops["linear/"].lr(0) == pytest.approx(0.005) and ops["dnn/"].lr(0) == 0.001


def test_tf1_optimizer_classes_defaults():
    """``tf.compat.v1.train`` (``tensorflow/python/training/adam.py``, ``adagrad.py``,
    ``ftrl.py``): AdamOptimizer ``epsilon=1e-08``; AdagradOptimizer
    ``initial_accumulator_value=0.1`` and no epsilon (``ApplyAdagrad``: ``var -= lr * grad *
    accum.rsqrt()``); FtrlOptimizer ``initial_accumulator_value=0.1``."""
    assert _hyper(train.AdamOptimizer())["epsilon"] == 1e-8
    adagrad = _hyper(train.AdagradOptimizer(0.1))
    assert (adagrad["init"], adagrad["epsilon"]) == (0.1, 0.0)
    assert _hyper(train.FtrlOptimizer(0.1))["init"] == 0.1
    assert _hyper(train.Adam())["epsilon"] == 1e-7  # keras legacy Adam


def _tf_ftrl(w, n, z, g, lr, l1, l2, beta):
    """``tensorflow/core/kernels/training_ops.cc`` ``ApplyFtrl`` (lr_power -0.5) after keras'
    ``adjusted_l2 = l2 + beta / (2 * lr)`` (``tf_keras/optimizers/legacy/ftrl.py``
    ``_resource_apply_dense``), written out in float64."""
    l2 = l2 + beta / (2 * lr)
    n_new = n + g * g
    z = z + g - (np.sqrt(n_new) - np.sqrt(n)) / lr * w
    quad = np.sqrt(n_new) / lr + 2 * l2
    w = np.where(np.abs(z) > l1, (np.sign(z) * l1 - z) / quad, 0.0)
    return w, n_new, z


@pytest.mark.parametrize("l1, l2, beta", [(0.0, 0.0, 0.0), (0.01, 0.1, 0.5)])
def test_ftrl_steps_equal_tensorflows_kernel(l1, l2, beta):
    """Keras' Ftrl over five steps equals TensorFlow's kernel: accumulator from 0.1, ``2 * l2``
    in the quadratic term, ``beta / lr``; a zero gradient and one whose square underflows
    float32 included.  With the accumulator at 0 (tierserve's FtrlOptimizer had no initial
    accumulator) the underflowing one divides by zero: -inf, then NaN."""
    opt = train.Ftrl(0.05, l1_regularization_strength=l1, l2_regularization_strength=l2,
                     beta=beta)
    impl = opt.impl
    w = np.zeros(6, np.float32)
    st = impl.init_state(w.shape)
    ref = (np.zeros(6), np.full(6, 0.1), np.zeros(6))
    rng = np.random.default_rng(0)
    for step in range(1, 6):
        g = rng.normal(size=6).astype(np.float32)
        g[0] = 0.0  # a weight with no gradient
        g[1] = 1e-30  # its square is 0 in float32
        impl.update_dense(w, g, st, 0.05, step)
        ref = _tf_ftrl(*ref, g.astype(np.float64), 0.05, l1, l2, beta)
        np.testing.assert_allclose(w, ref[0], rtol=2e-5, atol=1e-7)
    assert np.isfinite(w).all()


def test_optimizer_settings_not_implemented_are_refused_by_name():
    for make, name in [(lambda: train.Adam(amsgrad=True), "amsgrad"),
                       (lambda: train.Ftrl(learning_rate_power=-0.3), "learning_rate_power"),
                       (lambda: train.FtrlOptimizer(0.1, l2_shrinkage_regularization_strength=1),
                        "l2_shrinkage_regularization_strength"),
                       (lambda: train.SGD(clipnorm=1.0), "clipnorm")]:
        with pytest.raises(ConfigError, match=name):
            make()
    with pytest.raises(ConfigError, match="RMSProp is not implemented"):
        train.get_optimizer("RMSProp")


def test_tables_update_as_tensorflows_sparse_apply(tmp_path):
    """Adam's sparse apply moves every row (``tf_keras/optimizers/legacy/adam.py``
    ``_resource_apply_sparse``: ``m.assign(m * beta_1_t)`` then a scatter-add, and the
    variable ``assign_sub`` over the whole table); Adagrad's
    (``ResourceSparseApplyAdagradV2``) and Ftrl's only the rows looked up."""
    assert train.Adam().params(for_table=True).update_type is Update_t.Global
    assert train.AdamOptimizer().params(for_table=True).update_type is Update_t.Global
    for opt in (train.Adagrad(), train.Ftrl(), train.SGD(momentum=0.9), train.FtrlOptimizer(1)):
        assert opt.params(for_table=True).update_type is Update_t.Local

    ids = fc.categorical_column_with_identity("id", 4)
    name = "linear/linear_model/id/weights"
    for optimizer, row0_moves in (("Adam", True), ("Adagrad", False)):
        est = estimator.LinearRegressor([ids], str(tmp_path / optimizer), optimizer=optimizer)
        est.train(lambda: ({"id": np.array([0, 1])}, np.array([1.0, 2.0])), steps=1)
        before = est.get_variable_value(name)[0]
        est.train(lambda: ({"id": np.array([1, 2])}, np.array([1.0, 2.0])), steps=1)
        moved = not np.array_equal(est.get_variable_value(name)[0], before)
        assert moved == row0_moves, optimizer


def test_initializers(tmp_path):
    """Hidden and logits kernels Glorot-uniform, biases zero (``canned/dnn.py``
    ``_DNNModelV2``: ``kernel_initializer=tf.compat.v1.glorot_uniform_initializer()``, keras
    ``Dense`` ``bias_initializer='zeros'``); embedding columns a normal of standard deviation
    ``1/sqrt(dimension)`` truncated at two standard deviations
    (``tensorflow/python/feature_column/feature_column_v2.py`` ``embedding_column``:
    ``initializers.truncated_normal(mean=0.0, stddev=1 / math.sqrt(dimension))``); linear
    weights and bias zero (``LinearModel``: ``initializer=init_ops.zeros_initializer()``)."""
    ids = fc.categorical_column_with_identity("id", 20000)
    est = estimator.DNNLinearCombinedClassifier(
        str(tmp_path), linear_feature_columns=[ids, fc.numeric_column("x")],
        dnn_feature_columns=[fc.numeric_column("x"), fc.embedding_column(ids, 16)],
        dnn_hidden_units=[400, 300])
    est.train(lambda: ({"id": np.arange(20000), "x": np.zeros(20000, np.float32)},
                       np.zeros(20000, np.float32)), steps=1)
    store = est._store
    kernel = store.dense["dnn/hiddenlayer_1/kernel"]  # [400, 300], moved one small step
    limit = math.sqrt(6 / (400 + 300))
    assert np.abs(kernel).max() <= limit * 1.01
    assert kernel.std() == pytest.approx(limit / math.sqrt(3), rel=0.02)
    assert np.abs(store.dense["dnn/logits/bias"]).max() < 0.01  # zero, one step from it
    emb = est.get_variable_value(
        "dnn/input_from_feature_columns/input_layer/id_embedding/embedding_weights")
    std = 1 / math.sqrt(16)
    assert np.abs(emb).max() <= 2 * std + 0.01
    # a +-2 sigma truncated normal's standard deviation is 0.8796 sigma
    assert emb.std() == pytest.approx(0.87962566 * std, rel=0.02)
    fresh = estimator.LinearRegressor([ids], str(tmp_path / "lin"))
    fresh.train(lambda: ({"id": np.arange(5)}, np.zeros(5, np.float32)), steps=1)
    assert np.array_equal(fresh.get_variable_value("linear/linear_model/id/weights")[5:],
                          np.zeros((20000 - 5, 1), np.float32))


def _evaluate_loss(est, features, labels) -> float:
    return est.evaluate(lambda: (features, labels))["loss"]


def test_loss_reduction_sum_over_batch_size_and_sum(tmp_path):
    """``tf.estimator``'s V2 heads default to ``SUM_OVER_BATCH_SIZE``
    (``head/regression_head.py`` ``RegressionHead.__init__``) and reduce with keras'
    ``compute_weighted_loss`` (``tf_keras/utils/losses_utils.py`` ``reduce_weighted_loss``:
    the weighted losses' sum over the number of elements, ``[batch, label_dimension]``);
    ``loss_reduction=SUM`` keeps the sum.  tierserve divided a weighted loss by the sum of
    the weights.  A fresh linear model predicts 0, so the loss is that of the labels."""
    y = RNG.normal(size=(B, 2)).astype(np.float32)
    w = RNG.uniform(0.1, 3.0, size=B).astype(np.float32)
    feats = {"x": FEATURES["x"], "w": w}
    mean = estimator.LinearRegressor([fc.numeric_column("x")], str(tmp_path / "m"),
                                     label_dimension=2, weight_column="w")
    assert _evaluate_loss(mean, feats, y) == pytest.approx(
        float((w[:, None] * y * y).sum() / y.size), rel=1e-5)
    total = estimator.LinearRegressor([fc.numeric_column("x")], str(tmp_path / "s"),
                                      label_dimension=2, weight_column="w",
                                      loss_reduction=estimator.losses.Reduction.SUM)
    assert _evaluate_loss(total, feats, y) == pytest.approx(
        float((w[:, None] * y * y).sum()), rel=1e-5)


def test_tf1_losses_default_to_sum_by_nonzero_weights(tmp_path):
    """``tf.compat.v1.losses.sigmoid_cross_entropy`` (``tensorflow/python/ops/losses/
    losses_impl.py``): ``reduction=Reduction.SUM_BY_NONZERO_WEIGHTS``, the weighted sum over
    the number of non-zero weights."""
    w = np.where(np.arange(B) % 4 == 0, 0.0, 2.0).astype(np.float32)

    def model_fn(features, labels, mode):
        logits = estimator.layers.dense(fc.input_layer(features, [fc.numeric_column("x")]), 1,
                                        kernel_initializer="zeros")
        weights = fc.input_layer(features, [fc.numeric_column("w")])
        loss = estimator.losses.sigmoid_cross_entropy(labels, logits, weights=weights)
        return estimator.EstimatorSpec(mode, loss=loss,
                                       train_op=train.GradientDescentOptimizer(0.1).minimize(
                                           loss))

    est = estimator.Estimator(model_fn, str(tmp_path))
    got = _evaluate_loss(est, {"x": FEATURES["x"], "w": w}, LABELS)
    assert got == pytest.approx(float((w * math.log(2)).sum() / np.count_nonzero(w)), rel=1e-5)


def test_batch_norm_follows_the_activation_with_momentum_0999(tmp_path):
    """``canned/dnn.py`` ``_DNNModelV2.call``: per hidden layer ``Dense(activation)``, dropout,
    then ``BatchNormalization(momentum=0.999)``; keras' 2-D batch normalization is not fused
    and moves ``moving = moving * momentum + batch * (1 - momentum)`` with the batch's
    biased variance (``tf_keras/layers/normalization/batch_normalization.py``
    ``_assign_moving_average``, ``_moments``).  tierserve normalised before the activation
    and moved the averages by 0.999 of the batch."""
    x = RNG.normal(size=(B, 3)).astype(np.float32)
    est = estimator.DNNRegressor([5], [fc.numeric_column("x", shape=3)], str(tmp_path),
                                 batch_norm=True)
    feats, labels = {"x": x}, RNG.normal(size=B).astype(np.float32)
    est._program(ModeKeys.TRAIN, feats, est._labels_for(labels))
    kernel = est._store.dense["dnn/hiddenlayer_0/kernel"].copy()
    bias = est._store.dense["dnn/hiddenlayer_0/bias"].copy()
    est.train(lambda: (feats, labels), steps=1)
    h = np.maximum(x @ kernel + bias, 0.0)  # the activation comes first
    mean = est.get_variable_value("dnn/hiddenlayer_0/batchnorm_0/moving_mean")
    var = est.get_variable_value("dnn/hiddenlayer_0/batchnorm_0/moving_variance")
    np.testing.assert_allclose(mean, 0.001 * h.mean(axis=0), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(var, 0.999 + 0.001 * h.var(axis=0), rtol=1e-5)


def test_deepfm_default_optimizers_train_without_nan(tmp_path):
    """DeepCTR's ``deepctr_model_fn`` (``deepctr/estimator/utils.py``):
    ``get_optimizer_instance(linear_optimizer, 0.005)`` and ``(dnn_optimizer, 0.01)``,
    TensorFlow 1 optimizers (``canned/optimizers.py`` ``_OPTIMIZER_CLS_NAMES``), so the
    default ``'Ftrl'`` starts its accumulator at 0.1 (tierserve's started at 0: see
    :func:`test_ftrl_steps_equal_tensorflows_kernel`) and the loss is summed over the batch
    (``Head.create_estimator_spec``: ``Reduction.SUM``)."""
    cats = [fc.categorical_column_with_identity(k, 50) for k in ("a", "b")]
    est = estimator.DeepFMEstimator(cats, [fc.embedding_column(c, 4) for c in cats],
                                    dnn_hidden_units=[8], model_dir=str(tmp_path),
                                    l2_reg_linear=0, l2_reg_embedding=0)
    ops = _optimizers(est, {"a": np.arange(8) % 3, "b": np.arange(8) % 5}, np.ones(8))
    assert (type(ops["linear/"]), ops["linear/"].lr(0)) == (train.FtrlOptimizer,
                                                            pytest.approx(0.005))
    assert (type(ops["dnn/"]), ops["dnn/"].lr(0)) == (train.AdagradOptimizer,
                                                      pytest.approx(0.01))
    data = {k: RNG.integers(0, 50, size=256) for k in ("a", "b")}
    y = (data["a"] % 2).astype(np.float32)
    est.train(lambda: (data, y), steps=5)
    for name in est.get_variable_names():
        assert np.isfinite(est.get_variable_value(name)).all(), name
    loss = est.evaluate(lambda: (data, y))["loss"]
    per_example = est.evaluate(lambda: (data, y))["average_loss"]
    assert np.isfinite(loss) and loss == pytest.approx(256 * per_example, rel=1e-5)


def test_deepfm_logit_is_deepctrs_sum_of_linear_fm_and_dnn(tmp_path):
    """DeepCTR's ``DeepFMEstimator`` (``deepctr/estimator/models/deepfm.py``): the logit is
    ``linear_model`` (with its bias) + ``FM`` over the embedding columns (``0.5 * sum((sum_f
    e)^2 - sum_f e^2)``) + a ``DNN`` over the embeddings then the dense columns
    (``combined_dnn_input``) whose layers are ``dense`` then the activation
    (``deepctr/layers/core.py`` ``DNN.call``), read out by a bias-free ``Dense(1)``.  Checked
    with the model's own variables against numpy."""
    a, b = fc.categorical_column_with_identity("a", 5), fc.categorical_column_with_identity("b", 7)
    x = fc.numeric_column("x")
    est = estimator.DeepFMEstimator([a, b, x], [fc.embedding_column(a, 3),
                                                fc.embedding_column(b, 3), x],
                                    dnn_hidden_units=[4], model_dir=str(tmp_path),
                                    l2_reg_linear=0, l2_reg_embedding=0)
    f = {"a": np.array([0, 1, 4, 2]), "b": np.array([2, 6, 0, 2]),
         "x": np.array([0.5, -1.0, 2.0, 0.1], np.float32)}
    est.train(lambda: (f, np.array([1.0, 0.0, 1.0, 0.0], np.float32)), steps=3)
    v = {n: est.get_variable_value(n).astype(np.float64) for n in est.get_variable_names()}
    lin = (v["linear/linear_model/a/weights"][f["a"], 0]
           + v["linear/linear_model/b/weights"][f["b"], 0]
           + f["x"] * v["linear/linear_model/dense/kernel"][0, 0]
           + v["linear/linear_model/bias_weights"][0])
    ea = v["dnn/input_layer/a_embedding/embedding_weights"][f["a"]]
    eb = v["dnn/input_layer/b_embedding/embedding_weights"][f["b"]]
    fm = 0.5 * ((ea + eb) ** 2 - ea ** 2 - eb ** 2).sum(axis=1)
    h = np.maximum(np.concatenate([ea, eb, f["x"][:, None]], axis=1) @ v["dnn/dnn_0/kernel"]
                   + v["dnn/dnn_0/bias"], 0.0)
    assert not v["dnn/logits/bias"].any()  # use_bias=False: never trained
    dnn = (h @ v["dnn/logits/kernel"])[:, 0]
    got = [p["logits"][0] for p in est.predict(lambda: f)]
    np.testing.assert_allclose(got, lin + fm + dnn, rtol=1e-5, atol=1e-6)


def test_softmax_cross_entropy_takes_tf1_reductions_and_refuses_sums(tmp_path):
    """``tf.compat.v1.losses.softmax_cross_entropy`` (``losses_impl.py``) defaults to
    ``SUM_BY_NONZERO_WEIGHTS``: without weights, the mean over the examples, as
    ``SUM_OVER_BATCH_SIZE`` gives; a summed or unreduced loss is refused by name."""
    from tierserve.trainer import tf

    y = np.arange(B) % 3

    def loss_of(reduction):
        def model_fn(features, labels, mode):
            logits = estimator.layers.dense(fc.input_layer(features, [fc.numeric_column("x")]),
                                            3, kernel_initializer="zeros")
            kwargs = {} if reduction is None else {"reduction": reduction}
            loss = tf.losses.softmax_cross_entropy(tf.one_hot(labels, 3), logits, **kwargs)
            return estimator.EstimatorSpec(mode, loss=loss, train_op=train.GradientDescentOptimizer(
                0.1).minimize(loss))

        est = estimator.Estimator(model_fn, str(tmp_path / str(reduction)))
        return _evaluate_loss(est, {"x": FEATURES["x"]}, y)

    assert loss_of(None) == pytest.approx(math.log(3), rel=1e-6)  # zero logits: log(3) each
    assert loss_of(estimator.losses.Reduction.SUM_OVER_BATCH_SIZE) == pytest.approx(
        math.log(3), rel=1e-6)
    for reduction in (estimator.losses.Reduction.SUM, estimator.losses.Reduction.NONE):
        with pytest.raises(ConfigError, match="softmax_cross_entropy: reduction"):
            loss_of(reduction)
