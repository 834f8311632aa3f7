"""HugeCTR API forms its own notebooks and tests use: slot_size_array entries of 0 (DIN),
CrossEntropyLoss with label_dim 2, CreateHMemCache's tuning arguments, the continuous-training
notebook's low-level loop (DataReader.set_source with keysets), and the keyset warning."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from keyset_data import keyset_parts

import tierserve.trainer as hugectr
from tierserve.core.compat import HugeCTRCompatibilityWarning, reset_warnings
from tierserve.core.errors import ConfigError
from tierserve.model.layers import build_layer
from tierserve.trainer.data.errors import DataFileError
from tierserve.trainer.data.records import Records, SlotLayout
from tierserve.trainer.embedding.table import EmbeddingTable

SLOTS = 4
DIM = 8


# -- slot_size_array with zeros ------------------------------------------------------------------


def test_zero_slot_sizes_share_the_next_vocabulary():
    """HugeCTR's DIN test: [users, 0 x 10, items, 0 x 10, categories]: a slot of size 0 starts
    where the next one does (offset sum(sizes[:s])) and takes keys of that vocabulary."""
    from tierserve.trainer.data.records import shared_vocabulary_sizes

    sizes = [7, 0, 0, 5, 0, 3]
    params = hugectr.DataReaderParams(data_reader_type=hugectr.DataReaderType_t.Parquet,
                                      source=["x"], slot_size_array=sizes)
    assert params.slot_size_array == sizes
    layout = SlotLayout(1, 0, [hugectr.DataReaderSparseParam("s", 1, True, 6)], sizes)
    keys = np.array([6, 4, 0, 4, 2, 2], dtype=np.int64)  # one sample, one key per slot
    records = Records(np.zeros((1, 1), np.float32), np.zeros((1, 0), np.float32), keys,
                      np.arange(7, dtype=np.int64), 6)
    checked = layout.check(records, "f", 0)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    np.testing.assert_array_equal(checked.keys, keys + offsets)  # slots 1..3 share offset 7
    bad = Records(records.label, records.dense, np.array([6, 5, 0, 4, 2, 2], np.int64),
                  records.row_offsets, 6)
    message = r"key 5 is outside \[0, 5\) \(slot_size_array\[1\] = 0: the slot shares"
    with pytest.raises(DataFileError, match=message):
        layout.check(bad, "f", 0)
    assert shared_vocabulary_sizes(sizes).tolist() == [7, 5, 5, 5, 3, 3]
    assert shared_vocabulary_sizes([4, 0]).tolist() == [4, -1]  # nothing after: unbounded


def test_a_localized_table_initialises_with_zero_slot_sizes():
    opt = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.SGD)
    for kind in ("LocalizedSlotSparseEmbeddingHash", "LocalizedSlotSparseEmbeddingOneHot"):
        table = EmbeddingTable(kind, 4, 1, opt, slot_size_array=[100, 0, 0, 25])
        if kind.endswith("OneHot"):
            assert table.num_rows == 125
            # rows of the shared vocabulary are drawn within sqrt(1 / 25)
            assert np.abs(table.values[100:]).max() <= np.sqrt(1 / 25) + 1e-7
    with pytest.raises(Exception, match="not all 0"):
        EmbeddingTable("LocalizedSlotSparseEmbeddingHash", 4, 1, opt, slot_size_array=[0, 0])


# -- CrossEntropyLoss with label_dim 2 -----------------------------------------------------------


def _ce_layer(label_dim):
    layer = build_layer({"name": "loss", "type": "CrossEntropyLoss", "bottom": ["fc", "label"],
                         "top": ["loss"]})
    layer.build([(2,), (label_dim,)])
    return layer


def test_cross_entropy_takes_label_dim_2_as_hugectr_reads_it():
    """HugeCTR checks only the logits' width; its kernel reads sample i's label at label[i]
    of the [batch, label_dim] buffer."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 2)).astype(np.float32)
    y = rng.integers(0, 2, (6, 2)).astype(np.float32)
    layer = _ce_layer(2)
    (loss,), ctx = layer.forward(np, [x, y], [], [], True)
    cls = y.reshape(-1)[:6].astype(int)
    p = np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)
    expected = -np.log(p[np.arange(6), cls]).mean()
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    (grad, _), _ = layer.backward(np, [np.float32(1.0)], ctx, [])
    eps = 1e-3
    for i, j in ((0, 0), (3, 1), (5, 0)):
        xp_, xm = x.astype(np.float64), x.astype(np.float64)
        xp_ = xp_.copy()
        xp_[i, j] += eps
        xm = xm.copy()
        xm[i, j] -= eps
        lp = float(layer.forward(np, [xp_, y], [], [], False)[0][0])
        lm = float(layer.forward(np, [xm, y], [], [], False)[0][0])
        assert grad[i, j] == pytest.approx((lp - lm) / (2 * eps), rel=1e-3, abs=1e-6)


def test_a_model_with_label_dim_2_and_cross_entropy_compiles():
    solver = hugectr.CreateSolver(batchsize=16, batchsize_eval=16, repeat_dataset=True)
    reader = hugectr.DataReaderParams(data_reader_type=hugectr.DataReaderType_t.Norm,
                                      source=["unused"], check_type=hugectr.Check_t.Sum)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = hugectr.Model(solver, reader, hugectr.CreateOptimizer())
        model.add(hugectr.Input(label_dim=2, label_name="label", dense_dim=3, dense_name="d"))
        model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct,
                                     bottom_names=["d"], top_names=["fc"], num_output=2))
        model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.CrossEntropyLoss,
                                     bottom_names=["fc", "label"], top_names=["loss"]))
        try:
            model.compile()
        except Exception as exc:  # the reader opens the (missing) source after the graph
            assert "CrossEntropyLoss" not in str(exc) and "label" not in str(exc)
    with pytest.raises(ConfigError, match="classes >= 2"):
        build_layer({"name": "loss", "type": "CrossEntropyLoss", "bottom": ["fc", "label"],
                     "top": ["loss"]}).build([(1,), (1,)])


# -- CreateHMemCache -----------------------------------------------------------------------------


def test_hmem_cache_tuning_is_accepted_with_a_warning():
    reset_warnings()
    with pytest.warns(HugeCTRCompatibilityWarning) as record:
        config = hugectr.CreateHMemCache(num_blocks=2, target_hit_rate=0.5, max_num_evict=0)
    assert config.num_blocks == 2
    names = " ".join(str(w.message) for w in record)
    assert "target_hit_rate" in names and "max_num_evict" in names
    with pytest.raises(ConfigError, match="target_hit_rate must be in"):
        hugectr.CreateHMemCache(1, 1.5)
    with pytest.raises(ConfigError, match="max_num_evict must be >= 0"):
        hugectr.CreateHMemCache(1, 0.5, -1)


# -- the low-level loop with keysets, and the keyset warning -------------------------------------


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return keyset_parts(tmp_path_factory.mktemp("api_keysets"), SLOTS)


def _model(sources, etc=None, keyset=True):
    solver = hugectr.CreateSolver(batchsize=128, batchsize_eval=128, lr=0.01,
                                  repeat_dataset=False, i64_input_key=True, seed=5)
    reader = hugectr.DataReaderParams(
        data_reader_type=hugectr.DataReaderType_t.Norm, source=[s for s, _ in sources],
        keyset=[k for _, k in sources] if keyset else [], check_type=hugectr.Check_t.Sum)
    opt = hugectr.CreateOptimizer(optimizer_type=hugectr.Optimizer_t.Adam)
    model = hugectr.Model(solver, reader, opt, etc)
    model.add(hugectr.Input(label_dim=1, label_name="label", dense_dim=3, dense_name="dense",
                            data_reader_sparse_param_array=[
                                hugectr.DataReaderSparseParam("s", 1, True, SLOTS)]))
    model.add(hugectr.SparseEmbedding(
        embedding_type=hugectr.Embedding_t.DistributedSlotSparseEmbeddingHash,
        workspace_size_per_gpu_in_mb=1, embedding_vec_size=DIM, combiner="sum",
        sparse_embedding_name="emb", bottom_name="s", optimizer=opt))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.Reshape, bottom_names=["emb"],
                                 top_names=["flat"], leading_dim=SLOTS * DIM))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.InnerProduct, bottom_names=["flat"],
                                 top_names=["fc"], num_output=1))
    model.add(hugectr.DenseLayer(layer_type=hugectr.Layer_t.BinaryCrossEntropyLoss,
                                 bottom_names=["fc", "label"], top_names=["loss"]))
    model.compile()
    return model


def _etc(tmp_path):
    return hugectr.CreateETC(ps_types=[hugectr.TrainPSType_t.Staged],
                             sparse_models=[str(tmp_path / "etc_table.model")])


def test_the_low_level_loop_sets_each_file_list_and_keyset_itself(sources, tmp_path):
    """The continuous-training notebook's wdl_etc.py: reader.set_source(file_list), then
    etc.update(keyset), then train until the file list ends."""
    plain = _model(sources, keyset=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HugeCTRCompatibilityWarning)
        model = _model(sources, _etc(tmp_path))
    reader, etc = model.get_data_reader_train(), model.get_embedding_training_cache()
    steps = []
    for (file_list, keyset), m in ((p, m) for p in sources for m in (model, plain)):
        m.get_data_reader_train().set_source(file_list)
        if m is model:
            etc.update(keyset)
        n = 0
        while m.train():
            n += 1
        steps.append(n)
    assert steps == [8, 8, 8, 8]  # each file list once, 1,024 samples in batches of 128
    assert reader.is_eof()
    np.testing.assert_allclose(model.dense_parameters()[0], plain.dense_parameters()[0],
                               rtol=1e-6)


def test_keyset_warns_only_when_the_model_has_no_etc(sources, tmp_path):
    reset_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _model(sources, _etc(tmp_path))
    assert not [w for w in caught if "keyset" in str(w.message)]
    reset_warnings()
    with pytest.warns(HugeCTRCompatibilityWarning, match="DataReaderParams.keyset"):
        _model(sources)


# -- MatrixMultiply (HugeCTR's din_matmul test) ---------------------------------------------------


def test_matrix_multiply_is_the_per_sample_product():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((4, 1, 3)).astype(np.float32)
    b = rng.standard_normal((4, 3, 5)).astype(np.float32)
    layer = build_layer({"name": "mm", "type": hugectr.Layer_t.MatrixMultiply.value,
                         "bottom": ["a", "b"], "top": ["c"]})
    layer.build([(1, 3), (3, 5)])
    (out,), _ = layer.forward(np, [a, b], [], [], False)
    expected = np.stack([a[i] @ b[i] for i in range(4)])  # one sample at a time
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    with pytest.raises(ConfigError, match="inner dimensions differ"):
        build_layer({"name": "mm", "type": "MatrixMultiply", "bottom": ["a", "b"],
                     "top": ["c"]}).build([(1, 3), (4, 5)])


# -- check_out_tensor (HugeCTR's synthetic_multi_hot inference test) -----------------------------


def test_check_out_tensor_returns_the_last_steps_tensors(sources, tmp_path):
    model = _model(sources, keyset=False)
    with pytest.raises(ConfigError, match="no Train step has run yet"):
        model.check_out_tensor("emb", hugectr.Tensor_t.Train)
    model.get_data_reader_train().set_source(sources[0][0])
    model.train()
    emb = model.check_out_tensor("emb", hugectr.Tensor_t.Train)
    fc = model.check_out_tensor("fc", hugectr.Tensor_t.Train)
    assert emb.shape == (128, SLOTS, DIM) and fc.shape == (128, 1)
    # fc is the InnerProduct of the flattened embeddings, with the weights it ran with
    flat = model.check_out_tensor("flat")
    np.testing.assert_array_equal(flat, emb.reshape(128, SLOTS * DIM))
    with pytest.raises(ConfigError, match="no tensor 'nope'"):
        model.check_out_tensor("nope")


# -- graph JSON: max_vocabulary_size_global (hugectr2onnx reads it) -------------------------------


def test_graph_json_records_the_global_vocabulary_size(sources, tmp_path):
    import json

    model = _model(sources, keyset=False)  # Adam: two state copies; 1 MB, dim 8
    model.graph_to_json(str(tmp_path / "g.json"))
    layers = json.loads((tmp_path / "g.json").read_text())["layers"]
    hparam = next(layer for layer in layers if layer["name"] == "emb")["sparse_embedding_hparam"]
    assert hparam["max_vocabulary_size_global"] == (1 << 20) // ((1 + 2) * 4 * DIM)
    assert hparam["max_vocabulary_size_global"] == model.tables[0].max_rows


def test_train_and_eval_take_hugectrs_is_first_batch(sources):
    """HugeCTR's pybind_test/wdl_etc_low_level.py calls model.train(False)."""
    a, b = _model(sources, keyset=False), _model(sources, keyset=False)
    for m, flag in ((a, True), (b, False)):
        m.get_data_reader_train().set_source(sources[0][0])
        assert m.train(flag) and m.train(is_first_batch=flag)
    np.testing.assert_array_equal(a.dense_parameters()[0], b.dense_parameters()[0])


def test_graph_json_writes_nnz_per_slot_as_hugectr_and_reads_it_back(sources, tmp_path):
    """HugeCTR's graph_to_json writes nnz_per_slot as a list (slot_num copies of an int);
    hugectr2onnx takes max() of it.  Read back, the model is the same."""
    import json

    from tierserve.trainer.hugectr.adapters import input_from_data_layer

    model = _model(sources, keyset=False)  # DataReaderSparseParam("s", 1, True, SLOTS)
    model.graph_to_json(str(tmp_path / "g.json"))
    data = json.loads((tmp_path / "g.json").read_text())["layers"][0]
    assert data["sparse"][0]["nnz_per_slot"] == [1] * SLOTS
    back = input_from_data_layer(data).sparse_params[0]
    assert back.nnz_per_slot == 1 and back.max_nnz == SLOTS
    listed = dict(data["sparse"][0], nnz_per_slot=[2, 1, 1, 3])
    assert hugectr.DataReaderSparseParam.from_graph(listed).nnz_per_slot == [2, 1, 1, 3]
