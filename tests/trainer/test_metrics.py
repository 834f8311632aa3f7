"""Metrics: exact AUC against an O(n^2) pairwise count, HitRate, AverageLoss."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierserve.core.errors import InvalidInputError
from tierserve.trainer.metrics import (
    AUC,
    AverageLoss,
    HitRate,
    Metrics,
    MetricsType,
    auc_score,
    hit_rate,
)


def pairwise_auc(labels, preds) -> float:
    """P(pred of a positive > pred of a negative), ties counting one half."""
    pos = [p for y, p in zip(labels, preds) if y > 0.5]
    neg = [p for y, p in zip(labels, preds) if y <= 0.5]
    wins = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg)
    return wins / (len(pos) * len(neg))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, 1.0]),
                          st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.9, 1.0]) | st.floats(0, 1)),
                min_size=2, max_size=60))
def test_auc_matches_pairwise_count_with_ties(pairs):
    labels = np.array([p[0] for p in pairs])
    preds = np.array([p[1] for p in pairs], dtype=np.float32)
    if labels.min() == labels.max():
        assert math.isnan(auc_score(labels, preds))
        return
    assert auc_score(labels, preds) == pytest.approx(pairwise_auc(labels, preds), abs=1e-12)


def test_auc_known_values_and_accumulation_over_batches():
    assert auc_score([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == pytest.approx(0.75)
    assert auc_score([0, 1], [0.5, 0.5]) == 0.5
    m = AUC()
    m.update(np.array([[0.0], [1.0]]), np.array([[0.1], [0.8]]))
    m.update(np.array([[0.0], [1.0]]), np.array([[0.9], [0.2]]))
    assert m.result() == pytest.approx(auc_score([0, 1, 0, 1], [0.1, 0.8, 0.9, 0.2]))
    m.reset()
    assert math.isnan(m.result())


def test_auc_of_several_label_columns_is_their_mean():
    labels = np.array([[0, 1], [1, 0], [1, 1], [0, 0]], dtype=np.float32)
    preds = np.array([[0.1, 0.2], [0.9, 0.8], [0.8, 0.1], [0.2, 0.3]], dtype=np.float32)
    m = AUC()
    m.update(labels, preds)
    expected = (auc_score(labels[:, 0], preds[:, 0]) + auc_score(labels[:, 1], preds[:, 1])) / 2
    assert m.result() == pytest.approx(expected)


def test_auc_is_fast_on_a_million_samples():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 1_000_000)
    preds = np.round(rng.random(1_000_000), 3)  # many ties
    import time

    start = time.perf_counter()
    value = auc_score(labels, preds)
    elapsed = time.perf_counter() - start
    # Against one stable sort of the predictions, timed beside it (a loaded machine slows
    # both): the AUC takes 0.3-0.6 such sorts here; any per-sample Python work would take
    # many more.
    start = time.perf_counter()
    np.argsort(preds, kind="stable")
    sort = time.perf_counter() - start
    assert elapsed < 5 * sort, (elapsed, sort)
    assert abs(value - 0.5) < 0.01


def test_hit_rate_is_hugectrs_precision_above_0_8():
    labels = np.array([1, 0, 1, 1, 0])
    preds = np.array([0.9, 0.85, 0.5, 0.81, 0.1])
    assert hit_rate(labels, preds) == pytest.approx(2 / 3)
    assert hit_rate(labels, np.zeros(5)) == 0.0
    m = HitRate()
    m.update(labels[:2], preds[:2])
    m.update(labels[2:], preds[2:])
    assert m.result() == pytest.approx(2 / 3)


def test_average_loss_and_the_metrics_spec():
    m = AverageLoss()
    m.update(None, None, 0.5)
    m.update(None, None, 0.25)
    assert m.result() == pytest.approx(0.375)
    with pytest.raises(InvalidInputError, match="loss"):
        m.update(None, None)
    metrics = Metrics({MetricsType.HitRate: 0.8, MetricsType.AverageLoss: 0.0,
                       MetricsType.AUC: 1.0})
    metrics.update(np.array([[1.0], [0.0]]), np.array([[0.9], [0.1]]), loss=0.2)
    assert metrics.results() == [("HitRate", 1.0), ("AverageLoss", pytest.approx(0.2)),
                                 ("AUC", 1.0)]
    assert Metrics().results()[0][0] == "AUC"
    with pytest.raises(InvalidInputError, match="metric"):
        Metrics({"NDCG": 1.0})


def test_auc_of_a_two_class_softmax_is_over_the_positive_class():
    """Issue 13: CrossEntropyLoss predicts [B, 2] for a [B, 1] label; HugeCTR's AUC takes the
    positive class (fit crashed at its first evaluation)."""
    rng = np.random.default_rng(3)
    labels = rng.integers(0, 2, (200, 1)).astype(np.float32)
    p1 = np.clip(labels[:, 0] * 0.3 + rng.random(200) * 0.7, 0, 1)
    probs = np.stack([1 - p1, p1], axis=1)
    auc = AUC()
    auc.update(labels, probs)
    assert auc.result() == pytest.approx(auc_score(labels[:, 0], p1))
    hits = HitRate(0.5)
    hits.update(labels, probs)
    assert hits.result() == pytest.approx(float(labels[p1 > 0.5].mean()))


def test_fit_with_cross_entropy_loss_evaluates_auc(tmp_path):
    from model32 import train_model32

    import tierserve.trainer as hugectr

    m = train_model32(tmp_path / "data")
    solver = hugectr.CreateSolver(batchsize=256, batchsize_eval=256, max_eval_batches=4, lr=0.01)
    reader = hugectr.DataReaderParams(data_reader_type=hugectr.DataReaderType_t.Norm,
                                      source=[str(m.train_list)], eval_source=str(m.eval_list),
                                      check_type=hugectr.Check_t.Sum)
    opt = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.Adam)
    model = hugectr.Model(solver, reader, opt)
    model.add(hugectr.Input(label_dim=1, label_name="label", dense_dim=3, dense_name="dense",
                            data_reader_sparse_param_array=[
                                hugectr.DataReaderSparseParam("data1", 1, True, 4)]))
    model.add(hugectr.SparseEmbedding(
        embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
        workspace_size_per_gpu_in_mb=1, embedding_vec_size=4, combiner="sum",
        sparse_embedding_name="emb", bottom_name="data1", optimizer=opt))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Reshape, bottom_names=["emb"],
                                 top_names=["flat"], leading_dim=16))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Concat,
                                 bottom_names=["flat", "dense"], top_names=["both"]))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct, bottom_names=["both"],
                                 top_names=["fc"], num_output=2))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.CrossEntropyLoss,
                                 bottom_names=["fc", "label"], top_names=["loss"]))
    model.compile()
    model.fit(max_iter=40, display=1000, eval_interval=20)
    for _ in range(4):
        model.eval()
    assert dict(model.get_eval_metrics())["AUC"] > 0.7
