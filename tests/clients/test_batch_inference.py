"""``tierserve evaluate`` / ``predict`` on a model trained with 32-bit keys."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from model32 import train_model32

from tierserve.clients.cli import main


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    m = train_model32(tmp_path_factory.mktemp("m32"))
    version = m.root / "repo" / "m32" / "1"
    version.mkdir(parents=True)
    for f in (m.graph, m.dense, m.dense.with_name(m.dense.name + ".nontrainable")):
        if f.exists():
            shutil.copy(f, version)
    shutil.copytree(m.sparse, version / m.sparse.name)
    return m, version.parent


def _auc(out: str) -> float:
    return float(out.split("AUC")[1].split()[0])


def test_evaluate_reads_32_bit_norm_data_by_the_models_key_width(model_dir, capsys):
    m, model = model_dir
    assert main(["evaluate", "--model", str(model), "--data", str(m.eval_list),
                 "--no-progress"]) == 0
    auc = _auc(capsys.readouterr().out)
    assert auc == pytest.approx(m.eval_auc, abs=1e-4)  # the trainer's AUC on the same rows


def test_key_bits_from_the_data_when_the_graph_does_not_say(model_dir, capsys, tmp_path):
    import json

    m, model = model_dir
    copy = tmp_path / "m" / "1"
    shutil.copytree(model / "1", copy)
    graph = copy / m.graph.name
    data = json.loads(graph.read_text())
    del data["solver"]["i64_input_key"]
    graph.write_text(json.dumps(data))
    assert main(["evaluate", "--model", str(copy), "--data", str(m.eval_list),
                 "--no-progress"]) == 0
    assert _auc(capsys.readouterr().out) == pytest.approx(m.eval_auc, abs=1e-4)


def test_a_wrong_key_bits_names_the_right_one(model_dir, capsys):
    m, model = model_dir
    code = main(["evaluate", "--model", str(model), "--data", str(m.eval_list),
                 "--key-bits", "64", "--no-progress"])
    err = capsys.readouterr().err
    assert code != 0 and "--key-bits 32" in err


def test_predict_writes_one_row_per_sample(model_dir, tmp_path):
    m, model = model_dir
    out = tmp_path / "p.npy"
    assert main(["predict", "--model", str(model), "--data", str(m.eval_list),
                 "--key-bits", "32", "--output", str(out), "--no-progress"]) == 0
    preds = np.load(out)
    assert preds.shape == (1024, 1) and np.all((preds > 0) & (preds < 1))


def test_evaluate_reads_raw_data_as_the_model_was_trained_on_it(tmp_path, capsys):
    """Raw labels and dense values read as float32 (float_label_dense=True, not the default);
    evaluate reads them the same way (the graph JSON records it), so its AUC is the
    trainer's."""
    import tierserve.trainer as hugectr
    from tierserve.trainer.data.raw import write_raw_file

    rng = np.random.default_rng(5)
    for name, n in (("train.bin", 4096), ("eval.bin", 1024)):
        keys = rng.integers(0, 20, (n, 2)).astype(np.int32)
        dense = rng.standard_normal((n, 2)).astype(np.float32)
        logit = dense[:, 0] + (keys[:, 0] - 10) * 0.2
        label = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)[:, None]
        write_raw_file(tmp_path / name, label, dense, keys, float_label_dense=True)
    solver = hugectr.CreateSolver(model_name="raw", batchsize=256, batchsize_eval=1024,
                                  max_eval_batches=1, lr=0.01)
    reader = hugectr.DataReaderParams(data_reader_type=hugectr.DataReaderType_t.Raw,
                                      source=[str(tmp_path / "train.bin")],
                                      eval_source=str(tmp_path / "eval.bin"),
                                      check_type=hugectr.Check_t.Non, slot_size_array=[20, 20],
                                      float_label_dense=True)
    opt = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.Adam)
    model = hugectr.Model(solver, reader, opt)
    model.add(hugectr.Input(label_dim=1, label_name="label", dense_dim=2, dense_name="dense",
                            data_reader_sparse_param_array=[
                                hugectr.DataReaderSparseParam("d", 1, True, 2)]))
    model.add(hugectr.SparseEmbedding(
        embedding_type=hugectr.Embedding_t.LocalizedSlotSparseEmbeddingOneHot,
        workspace_size_per_gpu_in_mb=1, embedding_vec_size=2, combiner="sum",
        sparse_embedding_name="e", bottom_name="d", slot_size_array=[20, 20], optimizer=opt))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Reshape, bottom_names=["e"],
                                 top_names=["r"], leading_dim=4))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Concat, bottom_names=["r", "dense"],
                                 top_names=["c"]))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct, bottom_names=["c"],
                                 top_names=["fc"], num_output=1))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                                 bottom_names=["fc", "label"], top_names=["loss"]))
    model.compile()
    model.fit(max_iter=40, display=1000, eval_interval=1000)
    version = tmp_path / "repo" / "raw" / "1"
    model.graph_to_json(str(version / "raw.json"))
    model.save_params_to_files(str(version / "raw"), 40)
    want = dict(model._evaluate())["AUC"]
    assert want > 0.7
    assert main(["evaluate", "--model", str(version), "--data", str(tmp_path / "eval.bin"),
                 "--format", "raw", "--slot-size-array", "20", "20", "--no-progress"]) == 0
    assert _auc(capsys.readouterr().out) == pytest.approx(want, abs=1e-4)
