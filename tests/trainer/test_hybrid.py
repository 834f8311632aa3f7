"""HybridBackend's ranking-tutorial API: hb.data.Dataset.from_parquet feeding
hb.estimator.Estimator, hb.embedding_scope around the embedding lookups, hb.metrics.auc,
hb.enable_optimization; on the shared Criteo rows written as HybridBackend's prep.py writes
them (label, if0..if12, cf0..cf25 as int64 from hex)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from shared_data import CRITEO_SAMPLE, require

import tierserve.trainer.hybrid as hb
from tierserve.core.compat import HugeCTRCompatibilityWarning, reset_warnings
from tierserve.core.errors import ConfigError
from tierserve.trainer import tf

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pd = pytest.importorskip("pandas")

IF = [f"if{i}" for i in range(13)]
CF = [f"cf{i}" for i in range(26)]


def criteo_parquet(tmp_path):
    """The shared Criteo rows as HybridBackend's prep.py lays them out: train (first 6,000)
    and eval (last 2,000) files, row groups of 1,000."""
    df = pd.read_csv(require(CRITEO_SAMPLE), dtype=str, keep_default_na=False)
    cols = {"label": pa.array(df["label"].astype(np.int32))}
    for i, name in enumerate(IF):
        raw = df[f"I{i + 1}"]
        cols[name] = pa.array(np.where(raw == "", "0", raw).astype(float).astype(np.int32))
    for i, name in enumerate(CF):
        cols[name] = pa.array(np.array([int(v, 16) if v else 0 for v in df[f"C{i + 1}"]],
                                       dtype=np.int64))
    table = pa.table(cols)
    paths = []
    for part, rows in (("train", slice(0, 6000)), ("eval", slice(6000, 8000))):
        path = tmp_path / f"criteo_{part}.parquet"
        pq.write_table(table.slice(rows.start, rows.stop - rows.start), path,
                       row_group_size=1000)
        paths.append(str(path))
    return paths


def input_dataset(filenames, batch_size):
    ds = hb.data.Dataset.from_parquet(filenames)
    ds = ds.batch(batch_size, drop_remainder=True)
    ds = ds.map(lambda batch: (
        {f: (np.log1p(np.maximum(batch[f], 0)).astype(np.float32) if f in IF else batch[f])
         for f in batch if f != "label"}, batch["label"]))
    return ds.prefetch(2)


def model_fn(features, labels, mode, params):
    numeric = tf.feature_column.input_layer(
        features, [tf.feature_column.numeric_column(f) for f in IF])
    columns = [tf.feature_column.embedding_column(
        tf.feature_column.categorical_column_with_hash_bucket(f, 20000, dtype=tf.int64),
        dimension=8) for f in CF]
    with hb.embedding_scope(emb_device="/cpu:0"), tf.device("/cpu:0"):
        deep = [tf.feature_column.input_layer(features, [c]) for c in columns]
    net = tf.concat([numeric] + deep, axis=1)
    for units in (64, 32):
        net = tf.layers.dense(net, units, activation=tf.nn.relu)
    logits = tf.layers.dense(net, 1)
    prob = tf.sigmoid(logits)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"score": prob})
    labels = tf.reshape(tf.to_float(labels), shape=[-1, 1])
    loss = tf.losses.sigmoid_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(
            mode, loss=loss, eval_metric_ops={"auc": hb.metrics.auc(labels, prob,
                                                                     name="eval_auc")})
    train_op = tf.train.AdagradOptimizer(0.05).minimize(
        loss, global_step=tf.train.get_or_create_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _pairwise_auc(y, p):
    pos, neg = p[y == 1], p[y == 0]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return wins / (len(pos) * len(neg))


def test_ranking_tutorial_flow_on_criteo_parquet(tmp_path):
    train_file, eval_file = criteo_parquet(tmp_path)
    reset_warnings()
    with pytest.warns(HugeCTRCompatibilityWarning, match="hb.enable_optimization"):
        hb.enable_optimization(relocate_ops=True)
    estimator = hb.estimator.Estimator(model_fn, model_dir=str(tmp_path / "out"),
                                       config=tf.estimator.RunConfig(save_summary_steps=0))
    estimator.train_and_evaluate(
        tf.estimator.TrainSpec(input_fn=lambda: input_dataset([train_file] * 3, 200),
                               max_steps=90),
        tf.estimator.EvalSpec(input_fn=lambda: input_dataset(eval_file, 200)),
        eval_every_n_iter=45)
    result = estimator.evaluate(lambda: input_dataset(eval_file, 200))
    assert result["global_step"] == 90  # 3 passes of 6,000 rows, batches of 200
    # hb.metrics.auc is the exact AUC over every evaluated row
    scores = np.concatenate([b["score"].reshape(-1) for b in estimator.predict(
        lambda: input_dataset(eval_file, 200), yield_single_examples=False)])
    labels = pq.read_table(eval_file, columns=["label"]).column(0).to_numpy()
    assert result["auc"] == pytest.approx(_pairwise_auc(labels, scores), abs=1e-9)
    print(f"Criteo (HybridBackend's layout) eval AUC {result['auc']:.4f}")
    assert result["auc"] > 0.68  # hashed LR reaches ~0.73 on these rows


def test_embedding_scope_metrics_and_context_settings():
    assert hb.context.rank == 0 and hb.context.world_size == 1
    with pytest.raises(ConfigError, match="sharding=False"), hb.embedding_scope(sharding=False):
        pass
    with pytest.raises(ConfigError, match="unknown option"), hb.embedding_scope(emb_colour="red"):
        pass
    with hb.embedding_scope(emb_device="/cpu:0"):
        assert hb.current_options()["emb_device"] == "/cpu:0"
    assert hb.current_options() == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hb.disable_optimization()  # nothing to turn off, and no warning for it

    def metric(**kwargs):
        def fn(features, labels, mode):
            p = tf.sigmoid(tf.layers.dense(features["x"], 1))
            return tf.estimator.EstimatorSpec(
                mode, loss=tf.losses.mean_squared_error(labels, p),
                eval_metric_ops={"auc": hb.metrics.auc(labels, p, **kwargs)})
        est = tf.estimator.Estimator(fn, config=tf.estimator.RunConfig(save_summary_steps=0))
        return est.evaluate(lambda: ({"x": np.arange(8.0)}, np.arange(8) % 2))["auc"]

    assert 0 <= metric(num_thresholds=1000, summation_method="careful_interpolation") <= 1
    with pytest.raises(ConfigError, match="weights are not supported"):
        metric(weights=np.ones(8))
    with pytest.raises(ConfigError, match="curve='PR'"):
        metric(curve="PR")
