"""The HugeCTR Model API on a small generated dataset: building errors, model files, the
low-level loop, epoch mode, freezing, optimizer states, multi-task losses, predictions export."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
from hugectr_layout import export_predictions_text

import tierserve.trainer as hugectr
from tierserve.core.errors import ConfigError, CorruptModelFileError
from tierserve.model.dense_file import NONTRAINABLE_SUFFIX
from tierserve.ps.sparse_file import read_sparse_model

SLOTS = [50, 80, 30, 20]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    hugectr.DataGenerator(hugectr.DataGeneratorParams(
        format=hugectr.DataReaderType_t.Norm, label_dim=2, dense_dim=3, num_slot=len(SLOTS),
        i64_input_key=True, source=str(root / "file_list.txt"),
        eval_source=str(root / "file_list_test.txt"), slot_size_array=SLOTS,
        nnz_array=[2, 1, 1, 1], num_files=2, eval_num_files=1, num_samples_per_file=512,
        variable_nnz=True,
    )).generate()
    return root


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("TIERSERVE_NO_PROGRESS", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


def make_model(data, *, repeat=True, batch=128, optimizer=hugectr.Optimizer_t.Adam,
               metrics=None, lr=0.01, **solver):
    s = hugectr.CreateSolver(batchsize=batch, batchsize_eval=256, max_eval_batches=2, lr=lr,
                             repeat_dataset=repeat, i64_input_key=True,
                             metrics_spec=metrics or {hugectr.MetricsType.AUC: 1.0}, **solver)
    reader = hugectr.DataReaderParams(
        data_reader_type=hugectr.DataReaderType_t.Norm,
        source=[str(data / "file_list.txt")], eval_source=str(data / "file_list_test.txt"),
        check_type=hugectr.Check_t.Sum)
    opt = hugectr.CreateOptimizer(optimizer_type=optimizer)
    return hugectr.Model(s, reader, opt)


def add_input(model, label_dim=2, label_name="label"):
    model.add(hugectr.Input(label_dim=label_dim, label_name=label_name, dense_dim=3,
                            dense_name="dense",
                            data_reader_sparse_param_array=[
                                hugectr.DataReaderSparseParam("wide", 2, False, 1),
                                hugectr.DataReaderSparseParam("deep", 1, True, 3)]))


def add_embeddings(model):
    for name, bottom, dim in (("emb_wide", "wide", 1), ("emb_deep", "deep", 4)):
        model.add(hugectr.SparseEmbedding(
            embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
            workspace_size_per_gpu_in_mb=1, embedding_vec_size=dim, combiner="mean",
            sparse_embedding_name=name, bottom_name=bottom))


def small_net(model, label="label", label_dim=2, extra=()):
    """Embeddings -> reshape/concat -> FC+BatchNorm+ReLU -> FC(label_dim) -> BCE."""
    add_input(model, label_dim=label_dim, label_name=label)
    add_embeddings(model)
    d = hugectr.DenseLayer
    lt = hugectr.Layer_t
    model.add(d(layer_type=lt.Reshape, bottom_names=["emb_deep"], top_names=["r1"],
                leading_dim=12))
    model.add(d(layer_type=lt.Reshape, bottom_names=["emb_wide"], top_names=["r2"],
                leading_dim=1))
    model.add(d(layer_type=lt.Concat, bottom_names=["r1", "r2", "dense"], top_names=["c1"]))
    model.add(d(layer_type=lt.InnerProduct, bottom_names=["c1"], top_names=["fc1"],
                num_output=8))
    model.add(d(layer_type=lt.BatchNorm, bottom_names=["fc1"], top_names=["bn1"], factor=0.5))
    model.add(d(layer_type=lt.ReLU, bottom_names=["bn1"], top_names=["relu1"]))
    hidden = "relu1"
    for layer in extra:
        model.add(layer)
        hidden = layer.top_names[0]
    model.add(d(layer_type=lt.InnerProduct, bottom_names=[hidden], top_names=["fc2"],
                num_output=label_dim))
    model.add(d(layer_type=lt.BinaryCrossEntropyLoss, bottom_names=["fc2", label],
                top_names=["loss"], use_regularizer=True,
                regularizer_type=hugectr.Regularizer_t.L2, **{"lambda": 0.01}))
    return model


def first_eval_batch(model):
    reader = model.get_data_reader_eval()
    reader.set_source()
    return reader.next_batch()


def test_bad_bottom_name_names_the_layer(data):
    model = make_model(data)
    add_input(model)
    add_embeddings(model)
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct,
                                 bottom_names=["no_such_tensor"], top_names=["fc1"]))
    with pytest.raises(ConfigError, match=r"layer 'fc1' \(InnerProduct\): bottom tensor "
                                          r"'no_such_tensor' does not exist"):
        model.compile()


def test_embedding_with_unknown_sparse_input_is_named(data):
    model = make_model(data)
    add_input(model)
    model.add(hugectr.SparseEmbedding(
        embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
        workspace_size_per_gpu_in_mb=1, embedding_vec_size=4, combiner="sum",
        sparse_embedding_name="emb", bottom_name="nope"))
    with pytest.raises(ConfigError, match="SparseEmbedding 'emb': bottom_name 'nope'"):
        model.compile()


def test_unknown_arguments_are_rejected():
    with pytest.raises(ConfigError, match="unknown arguments"):
        hugectr.CreateSolver(batch_size=10)
    with pytest.raises(ConfigError, match="unknown layer type 'Nope'"):
        hugectr.DenseLayer(layer_type="Nope", bottom_names=["a"], top_names=["b"])
    with pytest.raises(ConfigError, match="unknown arguments"):
        hugectr.DenseLayer(layer_type=hugectr.Layer_t.ReLU, bottom_names=["a"],
                           top_names=["b"], num_outputs=3)


def test_save_files_reload_and_wrong_sized_dense_file(data, tmp_path):
    model = small_net(make_model(data))
    model.compile()
    for _ in range(5):
        assert model.train()
    prefix = str(tmp_path / "m" / "small")
    model.save_params_to_files(prefix, 5)
    model.graph_to_json(str(tmp_path / "small.json"))
    names = sorted(os.listdir(tmp_path / "m"))
    assert names == sorted([
        "small0_sparse_5.model", "small1_sparse_5.model", "small0_opt_sparse_5.model",
        "small1_opt_sparse_5.model", "small_dense_5.model",
        "small_dense_5.model" + NONTRAINABLE_SUFFIX, "small_opt_dense_5.model",
        "tierserve.manifest"])
    # dense file: W[16,8], b[8], gamma[8], beta[8], W[8,2], b[2], float32
    sizes = [16 * 8, 8, 8, 8, 8 * 2, 2]
    assert os.path.getsize(f"{prefix}_dense_5.model") == 4 * sum(sizes)
    flat = np.fromfile(f"{prefix}_dense_5.model", dtype="<f4")
    np.testing.assert_array_equal(flat[: 16 * 8].reshape(16, 8), model.dense_parameters()[0])
    assert os.path.getsize(f"{prefix}_dense_5.model" + NONTRAINABLE_SUFFIX) == 4 * 16
    assert os.path.getsize(f"{prefix}_opt_dense_5.model") == 2 * 4 * sum(sizes)  # Adam m, v
    table = read_sparse_model(f"{prefix}1_sparse_5.model")
    assert table.dim == 4 and len(table) > 0

    graph = json.loads((tmp_path / "small.json").read_text())
    bn = next(layer for layer in graph["layers"] if layer["type"] == "BatchNorm")
    assert bn["bn_param"]["factor"] == 0.5
    loss = graph["layers"][-1]
    assert (loss["regularizer"], loss["lambda"]) == ("L2", 0.01)

    again = make_model(data)
    again.construct_from_json(str(tmp_path / "small.json"), include_dense_network=True)
    again.compile()
    again.load_dense_weights(f"{prefix}_dense_5.model")
    again.load_sparse_weights({"emb_deep": f"{prefix}1_sparse_5.model",
                               "emb_wide": f"{prefix}0_sparse_5.model"})
    again.load_dense_optimizer_states(f"{prefix}_opt_dense_5.model")
    again.load_sparse_optimizer_states([f"{prefix}0_opt_sparse_5.model",
                                        f"{prefix}1_opt_sparse_5.model"])
    batch = first_eval_batch(model)
    np.testing.assert_allclose(again.predict_batch(batch), model.predict_batch(batch),
                               atol=1e-6)
    for a, b in zip(again.opt_states, model.opt_states):
        for sa, sb in zip(a, b):
            for k in sa:
                np.testing.assert_array_equal(sa[k], sb[k])
    # the running mean and variance came back from .nontrainable
    np.testing.assert_array_equal(again.states[4][0], model.states[4][0])

    short = tmp_path / "short.model"
    short.write_bytes(b"\0" * 40)
    with pytest.raises(CorruptModelFileError, match="short.model holds 10 float32 values; "
                                                    "the graph needs 170"):
        again.load_dense_weights(str(short))
    with pytest.raises(ConfigError, match="3 files for 2 embedding tables"):
        again.load_sparse_weights([f"{prefix}0_sparse_5.model"] * 3)
    with pytest.raises(ConfigError, match="no embedding named 'x'"):
        again.load_sparse_weights({"x": f"{prefix}0_sparse_5.model"})


def test_low_level_loop_and_export_predictions(data, tmp_path):
    model = small_net(make_model(data, metrics={hugectr.MetricsType.AUC: 1.0,
                                                hugectr.MetricsType.AverageLoss: 0.0}))
    model.compile()
    lr_sch = model.get_learning_rate_scheduler()
    model.start_data_reading()
    losses = []
    for _ in range(30):
        model.set_learning_rate(lr_sch.get_next())
        model.train()
        losses.append(model.get_current_loss())
    assert np.isfinite(losses).all() and np.mean(losses[-5:]) < np.mean(losses[:5])
    text = {"pred": "", "label": ""}
    for _ in range(2):
        assert model.eval()
        model.export_predictions(str(tmp_path / "pred"), str(tmp_path / "label"))
        pred, label = model._last_eval
        text["pred"] += export_predictions_text(pred.ravel().tolist())
        text["label"] += export_predictions_text(label.ravel().tolist())
    metrics = dict(model.get_eval_metrics())
    assert set(metrics) == {"AUC", "AverageLoss"} and 0 <= metrics["AUC"] <= 1
    # HugeCTR's layout: all values on one line, each followed by a space (label_dim 2 here)
    assert (tmp_path / "pred").read_text() == text["pred"]
    assert (tmp_path / "label").read_text() == text["label"]
    pred = np.loadtxt(tmp_path / "pred")
    label = np.loadtxt(tmp_path / "label")
    assert pred.shape == label.shape == (2 * 256 * 2,)
    assert np.abs(pred[-512:] - model._last_eval[0].flatten()).max() < 1e-5
    inc = model.get_incremental_model()
    assert len(inc) == 2 and inc[1][1].shape[1] == 4 and len(inc[1][0]) == len(inc[1][1])


def test_epoch_mode_reader_eof_and_set_source(data):
    model = small_net(make_model(data, repeat=False, batch=300))
    model.compile()
    reader = model.get_data_reader_train()
    steps = 0
    while model.train():
        steps += 1
    assert steps == 4  # 1024 samples: 300, 300, 300, 124
    assert reader.is_eof()
    model.set_source(source=str(data / "file_list.txt"))
    assert not reader.is_eof() and model.train()
    model.fit(num_epochs=2, display=1, eval_interval=3)


def test_freezing(data):
    model = small_net(make_model(data))
    model.compile()
    model.train()
    model.freeze_dense()
    model.freeze_embedding("emb_deep")
    dense = model.dense_parameters()
    deep = model.tables[1].export().embeddings.copy()
    wide = model.tables[0].export().embeddings.copy()
    model.train()
    for a, b in zip(dense, model.dense_parameters()):
        np.testing.assert_array_equal(a, b)
    assert np.array_equal(model.tables[1].export().embeddings[: len(deep)], deep)
    assert not np.array_equal(model.tables[0].export().embeddings[: len(wide)], wide)
    model.unfreeze_dense()
    model.unfreeze_embedding()
    model.freeze_embedding()
    model.train()
    assert not all(np.array_equal(a, b) for a, b in zip(dense, model.dense_parameters()))
    with pytest.raises(ConfigError, match="no embedding named"):
        model.freeze_embedding("nope")


def test_fit_stops_at_auc_threshold_and_snapshots(data, tmp_path, capsys):
    model = small_net(make_model(data, metrics={hugectr.MetricsType.AUC: 0.5}))
    model.compile()
    model.fit(max_iter=50, display=10, eval_interval=5, snapshot=3,
              snapshot_prefix=str(tmp_path / "snap"))
    out = capsys.readouterr()
    assert "training stops at iteration 5" in out.out + out.err
    assert (tmp_path / "snap_dense_3.model").exists()
    assert not (tmp_path / "snap_dense_6.model").exists()


def test_reset_learning_rate_scheduler(data):
    model = small_net(make_model(data))
    model.compile()
    model.reset_learning_rate_scheduler(base_lr=0.5, warmup_steps=2)
    sch = model.get_learning_rate_scheduler()
    assert [sch.get_next(), sch.get_next(), sch.get_next()] == [0.25, 0.5, 0.5]


def test_group_dense_layer_and_sparse_only_reconstruction(data, tmp_path):
    model = make_model(data)
    add_input(model)
    add_embeddings(model)
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Reshape,
                                 bottom_names=["emb_deep"], top_names=["r1"], leading_dim=12))
    model.add(hugectr.GroupDenseLayer(group_layer_type=hugectr.GroupLayer_t.GroupFusedInnerProduct,
                                      bottom_name_list=["r1"], top_name_list=["g1", "g2", "g3"],
                                      num_outputs=[16, 8, 2],
                                      last_act_type=hugectr.Activation_t.Non))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                                 bottom_names=["g3", "label"], top_names=["loss"]))
    model.compile()
    model.summary()
    model.train()
    model.graph_to_json(str(tmp_path / "g.json"))
    layers = json.loads((tmp_path / "g.json").read_text())["layers"]
    fused = [layer for layer in layers if layer["type"] == "FusedInnerProduct"]
    assert [f["activation"] for f in fused] == ["Relu", "Relu", "Non"]

    # a new dense network on top of the saved embeddings
    model.save_params_to_files(str(tmp_path / "g"), 1)
    tuned = make_model(data)
    tuned.construct_from_json(str(tmp_path / "g.json"), include_dense_network=False)
    tuned.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Reshape,
                                 bottom_names=["emb_deep"], top_names=["r1"], leading_dim=12))
    tuned.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct, bottom_names=["r1"],
                                 top_names=["out"], num_output=2))
    tuned.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                                 bottom_names=["out", "label"], top_names=["loss"]))
    tuned.compile()
    tuned.load_sparse_weights([str(tmp_path / "g0_sparse_1.model"),
                               str(tmp_path / "g1_sparse_1.model")])
    assert tuned.train()


def multi_task_model(data):
    """Two heads, "click" and "buy", the second with loss weight 0."""
    model = make_model(data)
    model.add(hugectr.Input(label_dim=[1, 1], label_name=["click", "buy"], dense_dim=3,
                            dense_name="dense",
                            data_reader_sparse_param_array=[
                                hugectr.DataReaderSparseParam("wide", 2, False, 1),
                                hugectr.DataReaderSparseParam("deep", 1, True, 3)]))
    add_embeddings(model)
    d, lt = hugectr.DenseLayer, hugectr.Layer_t
    model.add(d(layer_type=lt.Reshape, bottom_names=["emb_deep"], top_names=["r1"],
                leading_dim=12))
    model.add(d(layer_type=lt.Concat, bottom_names=["r1", "dense"], top_names=["c1"]))
    model.add(d(layer_type=lt.InnerProduct, bottom_names=["c1"], top_names=["fc1"],
                num_output=8))
    model.add(d(layer_type=lt.ReLU, bottom_names=["fc1"], top_names=["h"]))
    for task in ("click", "buy"):
        model.add(d(layer_type=lt.InnerProduct, bottom_names=["h"], top_names=[f"{task}_fc"],
                    num_output=1))
        model.add(d(layer_type=lt.BinaryCrossEntropyLoss,
                    bottom_names=[f"{task}_fc", task], top_names=[f"{task}_loss"]))
    model.compile(loss_names=["click", "buy"], loss_weights=[1.0, 0.0])
    return model


def test_multi_task_losses_with_weights(data):
    model = multi_task_model(data)
    before = model.dense_parameters()
    model.train()
    after = model.dense_parameters()
    # the "buy" head has weight 0: its parameters get no gradient
    np.testing.assert_array_equal(before[-2], after[-2])
    assert not np.array_equal(before[-4], after[-4])
    batch = first_eval_batch(model)
    assert model.predict_batch(batch).shape == (batch.batch_size, 2)


def test_multi_task_graph_round_trip(data, tmp_path):
    model = multi_task_model(data)
    assert model.train()
    model.graph_to_json(str(tmp_path / "multi.json"))
    graph = json.loads((tmp_path / "multi.json").read_text())
    assert graph["layers"][0]["label"]["top"] == ["click", "buy"]
    prefix = str(tmp_path / "multi")
    model.save_params_to_files(prefix, 1)
    again = make_model(data)
    again.construct_from_json(str(tmp_path / "multi.json"), include_dense_network=True)
    again.compile(loss_names=["click", "buy"], loss_weights=[1.0, 0.0])
    again.load_dense_weights(f"{prefix}_dense_1.model")
    again.load_sparse_weights([f"{prefix}0_sparse_1.model", f"{prefix}1_sparse_1.model"])
    batch = first_eval_batch(model)
    np.testing.assert_allclose(again.predict_batch(batch), model.predict_batch(batch), atol=1e-6)


def test_mixed_precision_on_cpu_is_float32(data):
    model = small_net(make_model(data, use_mixed_precision=True, scaler=1024))
    with pytest.warns(UserWarning, match="float32"):
        model.compile()
    assert model.compute_dtype == np.float32 and model.loss_scale == 1.0
    assert model.train()


def test_reference_group_dense_snippet_with_two_top_interaction(data):
    """The GroupDenseLayer example of HugeCTR's Python interface document, nearly verbatim
    (smaller widths; an FC brings the dense features to the embedding width)."""
    model = make_model(data)
    add_input(model, label_dim=2)
    add_embeddings(model)
    model.add(hugectr.GroupDenseLayer(group_layer_type=hugectr.GroupLayer_t.GroupFusedInnerProduct,
                                      bottom_name=["dense"],
                                      top_name_list=["fc1", "fc2", "fc3"],
                                      num_outputs=[32, 16, 4],
                                      last_act_type=hugectr.Activation_t.Relu))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Interaction,
                                 bottom_names=["fc3", "emb_deep"],
                                 top_names=["interaction1", "interaction1_grad"]))
    model.add(hugectr.GroupDenseLayer(group_layer_type=hugectr.GroupLayer_t.GroupFusedInnerProduct,
                                      bottom_name_list=["interaction1", "interaction1_grad"],
                                      top_name_list=["fc4", "fc5", "fc6", "fc7", "fc8"],
                                      num_outputs=[32, 32, 16, 8, 2],
                                      last_act_type=hugectr.Activation_t.Non))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                                 bottom_names=["fc8", "label"], top_names=["loss"]))
    model.compile()
    assert model.network.shapes["interaction1"] == (4 + 6 + 1,)  # 4 + 4*3/2 + 1
    before = model.dense_parameters()
    assert model.train() and np.isfinite(model.get_current_loss())
    assert not np.array_equal(before[0], model.dense_parameters()[0])  # gradient reached fc1


def test_fit_prints_loss_lines_without_a_progress_bar(data, capsys):
    model = small_net(make_model(data))
    model.compile()
    model.fit(max_iter=4, display=2, eval_interval=0)
    out = capsys.readouterr().out
    assert "[tierserve] iter 2: loss" in out and "[tierserve] iter 4: loss" in out


def test_mixed_precision_path_with_float16_on_numpy(data):
    """The GPU's float16 + loss-scaling path, run on numpy's float16 to check its arithmetic:
    float32 master weights, float16 compute, the loss scale divided out of the gradients."""
    model = small_net(make_model(data))
    model.compile()
    model.mixed, model.compute_dtype, model.loss_scale = True, np.float16, 1024.0
    losses = []
    for _ in range(20):
        model.train()
        losses.append(model.get_current_loss())
    assert np.isfinite(losses).all() and np.mean(losses[-5:]) < np.mean(losses[:5])
    assert all(p.dtype == np.float32 for p in model.dense_parameters())
    # an overflowing scale makes a step skip its update instead of corrupting the weights
    model.loss_scale = 1e30
    before = model.dense_parameters()
    with np.errstate(all="ignore"):
        model.train()
    for a, b in zip(before, model.dense_parameters()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["L1", "L2"])
def test_regularizer_adds_its_gradient(data, kind):
    """HugeCTR's regularizers over all dense weights: L2 adds lambda/B * w, L1
    lambda/B * sign(w) to each gradient (B = batch size)."""
    def build(use):
        model = make_model(data, optimizer=hugectr.Optimizer_t.SGD, lr=0.1)
        add_input(model)
        add_embeddings(model)
        d, lt = hugectr.DenseLayer, hugectr.Layer_t
        model.add(d(layer_type=lt.Reshape, bottom_names=["emb_deep"], top_names=["r1"],
                    leading_dim=12))
        model.add(d(layer_type=lt.InnerProduct, bottom_names=["r1"], top_names=["fc"],
                    num_output=2))
        model.add(d(layer_type=lt.BinaryCrossEntropyLoss, bottom_names=["fc", "label"],
                    top_names=["loss"], use_regularizer=use,
                    regularizer_type=getattr(hugectr.Regularizer_t, kind), **{"lambda": 0.5}))
        model.compile()
        return model

    plain, regular = build(False), build(True)
    batch = first_eval_batch(plain)
    start = plain.dense_parameters()
    plain.train_on_batch(batch)
    regular.train_on_batch(batch)
    for w0, a, b in zip(start, plain.dense_parameters(), regular.dense_parameters()):
        term = w0 if kind == "L2" else np.sign(w0)
        np.testing.assert_allclose(a - b, 0.1 * 0.5 / batch.batch_size * term, atol=1e-6)
    assert regular.get_current_loss() > plain.get_current_loss()


def test_fit_epoch_mode_runs_each_epoch_once(data):
    model = small_net(make_model(data, repeat=False, batch=300))
    model.compile()
    model.fit(num_epochs=3, display=100, eval_interval=0)
    # 4 batches per epoch (1,024 samples); one learning-rate step per trained batch
    assert model.get_learning_rate_scheduler().step == 12


@pytest.mark.parametrize("optimizer", [hugectr.Optimizer_t.AdaGrad, hugectr.Optimizer_t.Adam])
def test_column_major_weights_train_as_row_major_ones(data, optimizer):
    """Fully connected weights are stored column-major on the CPU (faster BLAS products);
    a model whose weights and optimizer state are made row-major again trains to the same
    values."""
    models = [small_net(make_model(data, optimizer=optimizer)) for _ in range(2)]
    for m in models:
        m.compile()
    fc = [i for i, layer in enumerate(models[0].network.layers)
          if layer.type_name == "InnerProduct"]
    assert fc and all(models[0].params[i][0].flags.f_contiguous for i in fc)
    row_major = models[1]
    for i in fc:
        row_major.params[i][0] = np.ascontiguousarray(row_major.params[i][0])
        state = row_major.opt_states[i][0]
        for name in state:
            state[name] = np.ascontiguousarray(state[name])
    for _ in range(4):
        for m in models:
            assert m.train()
    assert not row_major.params[fc[0]][0].flags.f_contiguous
    for a, b in zip(models[0].dense_parameters(), row_major.dense_parameters()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
