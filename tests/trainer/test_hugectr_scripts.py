"""The scripts of HugeCTR's two Python interface documents run with one import changed:
tests/trainer/hugectr_scripts/, each in a scratch folder holding the data and
configuration files it names (see that folder's README)."""

from __future__ import annotations

import json
import runpy
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
from model32 import SLOTS, train_model32

from tierserve.model.blas_threads import blas_threads

SCRIPTS = Path(__file__).resolve().parent / "hugectr_scripts"


def run(name: str, folder: Path, monkeypatch) -> dict:
    """The globals of ``hugectr_scripts/<name>.py`` after running it in ``folder``."""
    monkeypatch.chdir(folder)
    monkeypatch.setenv("TIERSERVE_NO_PROGRESS", "1")
    with warnings.catch_warnings(), blas_threads(1):
        warnings.simplefilter("ignore", UserWarning)
        return runpy.run_path(str(SCRIPTS / f"{name}.py"), run_name="__main__")


@pytest.fixture(scope="module")
def model32(tmp_path_factory):
    return train_model32(tmp_path_factory.mktemp("m32"))


def _copy_model(m, folder: Path) -> None:
    shutil.copy(m.graph, folder)
    shutil.copy(m.dense, folder)
    nontrainable = m.dense.with_name(m.dense.name + ".nontrainable")
    if nontrainable.exists():
        shutil.copy(nontrainable, folder)
    shutil.copytree(m.sparse, folder / m.sparse.name)
    shutil.copy(m.root / "eval.data", folder)
    (folder / "eval_list.txt").write_text(f"1\n{folder / 'eval.data'}\n")


def test_new_inference_flow_on_a_32_bit_model(model32, tmp_path, monkeypatch):
    _copy_model(model32, tmp_path)
    g = run("new_inference", tmp_path, monkeypatch)
    assert g["predictions"].shape == (4 * 256, 1)
    # the same AUC the trainer measured on these rows (1024 = the whole eval file)
    assert g["auc"] == pytest.approx(model32.eval_auc, abs=1e-4)
    g["inference_model"].close()
    session = run("new_inference_session", tmp_path, monkeypatch)["inference_session"]
    from tierserve.trainer.data.norm import iter_norm_file

    _, rec = next(iter_norm_file(tmp_path / "eval.data", 1, 3, SLOTS, "Sum", False))
    keys = rec.keys[: 2 * SLOTS]
    assert keys.max() > 2**31  # unsigned 32-bit keys
    out = session.predict(rec.dense[:2].ravel().tolist(), keys.tolist(),
                          list(range(2 * SLOTS + 1)))
    np.testing.assert_allclose(out, g["predictions"][:2, 0], atol=1e-6)
    session.model.close()


def test_old_inference_flow(model32, tmp_path, monkeypatch):
    _copy_model(model32, tmp_path)
    graph = json.loads(model32.graph.read_text())
    graph["inference"] = {"max_batchsize": 64, "hit_rate_threshold": 0.9,
                          "dense_model_file": model32.dense.name,
                          "sparse_model_file": model32.sparse.name, "label": 1,
                          "input_key_type": "I32"}
    loss = graph["layers"][-1]
    graph["layers"][-1] = {"name": "sigmoid", "type": "Sigmoid", "bottom": loss["bottom"][0],
                           "top": "sigmoid"}
    (tmp_path / "your_inference_config.json").write_text(json.dumps(graph))
    from tierserve.trainer.data.norm import iter_norm_file

    _, rec = next(iter_norm_file(tmp_path / "eval.data", 1, 3, SLOTS, "Sum", False))
    n = 3
    lines = [
        " ".join(str(int(v)) for v in rec.label[:n, 0]),
        " ".join(repr(float(v)) for v in rec.dense[:n].ravel()),
        " ".join(str(int(k)) for k in rec.keys[: n * SLOTS]),
        " ".join(str(i) for i in range(n * SLOTS + 1)),
    ]
    (tmp_path / "your_inference_inputs_data.txt").write_text("\n".join(lines) + "\n")
    graph["solver"]["model_name"] = "your_model_name"
    g = run("old_inference", tmp_path, monkeypatch)
    # the same predictions as the current API on the same samples
    import tierserve.trainer as hugectr

    model = hugectr.inference.InferenceModel(str(model32.graph), model32.inference_params())
    want = model.predict(1, str(tmp_path / "eval_list.txt"), "Norm", "Sum")[:n, 0]
    model.close()
    np.testing.assert_allclose(g["output"], want, atol=1e-6)
    from tierserve.core.errors import ConfigError

    with pytest.raises(ConfigError, match="i64_input_key=True but the session has 32-bit keys"):
        g["inference_session"].predict(g["dense_features"], g["embedding_columns"],
                                       g["row_ptrs"], True)


def test_scripts_import_tierserve_where_the_documents_import_hugectr():
    import re

    for path in sorted(SCRIPTS.glob("*.py")):
        text = path.read_text()
        assert not re.search(r"^\s*(import|from) hugectr", text, re.M), path.name
        assert re.search(r"^(import|from) tierserve\.trainer", text, re.M), path.name


@pytest.fixture(scope="module")
def wdl_folder(tmp_path_factory):
    """new_data_generator.py and new_training.py run in one folder (the data the first
    writes is what the second reads)."""
    folder = tmp_path_factory.mktemp("wdl")
    mp = pytest.MonkeyPatch()
    try:
        generated = run("new_data_generator", folder, mp)
        trained = run("new_training", folder, mp)
    finally:
        mp.undo()
    return folder, generated, trained


def test_new_data_generator_writes_the_norm_files(wdl_folder):
    from tierserve.trainer.data.filelist import read_file_list
    from tierserve.trainer.data.norm import read_norm_header

    folder, _, _ = wdl_folder
    files = read_file_list(folder / "wdl_norm" / "file_list.txt")
    header = read_norm_header(files[0])
    assert len(files) == 2 and header["slot_num"] == 28 and header["number_of_records"] == 2048


def test_new_training_examples(wdl_folder):
    folder, _, g = wdl_folder
    model = g["model"]
    assert dict(g["metrics"])["AUC"] > 0.5
    for name in ("wdl.json", "wdl0_sparse_20.model", "wdl_1_sparse_4000.model",
                 "wdl__dense_4000.model", "predictions1", "label1"):
        assert (folder / name).exists(), name
    preds = np.loadtxt(folder / "predictions1")
    labels = np.loadtxt(folder / "label1")
    assert preds.shape == labels.shape == (2 * 512,)  # max_eval_batches x batchsize_eval
    # the files reload into a fresh model that predicts the same
    import tierserve.trainer as hugectr

    fresh = hugectr.Model(model.solver, model.reader_params, model.opt_params)
    fresh.construct_from_json(str(folder / "wdl.json"), True)
    fresh.compile()
    fresh.load_dense_weights(str(folder / "wdl__dense_4000.model"))
    fresh.load_sparse_weights([str(folder / "wdl_0_sparse_4000.model"),
                               str(folder / "wdl_1_sparse_4000.model")])
    del fresh


def _old_config(folder: Path, wdl: Path, sources: list[str], eval_source: str) -> None:
    """your_config.json: the Wide&Deep graph JSON over 32-bit data in ``folder``."""
    import tierserve.trainer as hugectr

    gen = hugectr.tools.DataGenerator(hugectr.tools.DataGeneratorParams(
        format=hugectr.DataReaderType_t.Norm, label_dim=1, dense_dim=13, num_slot=28,
        i64_input_key=False, source=str(folder / "data" / "file_list.txt"),
        eval_source=str(folder / "data" / "file_list_test.txt"),
        slot_size_array=[500] * 2 + [100] * 26, check_type=hugectr.Check_t.Sum,
        num_files=len(sources), eval_num_files=1, num_samples_per_file=512))
    gen.generate()
    from tierserve.trainer.data.filelist import read_file_list

    train = read_file_list(folder / "data" / "file_list.txt")
    for name, path in zip(sources, train):
        (folder / name).write_text(f"1\n{path}\n")
        keys = np.arange(10, dtype=np.uint32)
        keys.tofile(folder / name.replace(".txt", ".keyset"))
    test = read_file_list(folder / "data" / "file_list_test.txt")
    (folder / eval_source).write_text(f"1\n{test[0]}\n")
    graph = json.loads((wdl / "wdl.json").read_text())
    graph["layers"][0]["source"] = sources[0]
    graph["layers"][0]["eval_source"] = eval_source
    (folder / "your_config.json").write_text(json.dumps(graph))


def test_old_non_epoch_training(wdl_folder, tmp_path, monkeypatch):
    _old_config(tmp_path, wdl_folder[0], ["file_list.0.txt"], "file_list.1.txt")
    g = run("old_non_epoch", tmp_path, monkeypatch)
    assert g["sess"].model.solver.i64_input_key is False
    assert dict(g["metrics"])["AUC"] > 0.4
    assert (tmp_path / "0_sparse_20.model").is_dir() and (tmp_path / "_dense_20.model").exists()
    preds = np.loadtxt(tmp_path / "predictions.txt")
    assert preds.shape == (2 * 256,) and np.all((preds > 0) & (preds < 1))
    assert g["lr_sch"].get_next() == pytest.approx(0.001)  # the JSON solver's schedule


def test_old_epoch_training(wdl_folder, tmp_path, monkeypatch):
    sources = [f"file_list.{i}.txt" for i in range(5)]
    _old_config(tmp_path, wdl_folder[0], sources, "file_list.5.txt")
    (tmp_path / "your_temp_embedding_dir").mkdir()
    g = run("old_epoch", tmp_path, monkeypatch)
    assert g["iteration"] == 5 * 2  # five files of 512 samples, batches of 256, one epoch each
    assert (tmp_path / f"0_sparse_{g['iteration']}.model").is_dir()


def test_new_group_dense_layer_example(wdl_folder, monkeypatch):
    g = run("new_group_dense", wdl_folder[0], monkeypatch)
    layers = [layer["type"] for layer in g["model"].graph().layers]
    assert layers.count("FusedInnerProduct") == 8 and "Interaction" in layers
    assert np.isfinite(g["model"].get_current_loss())


def test_new_raw_and_parquet_readers_and_mlperf_params(tmp_path, monkeypatch):
    from tierserve.core.compat import HugeCTRCompatibilityWarning, reset_warnings

    run("new_data_generator_raw_parquet", tmp_path, monkeypatch)
    reset_warnings()
    monkeypatch.chdir(tmp_path)
    with pytest.warns(HugeCTRCompatibilityWarning) as caught, blas_threads(1):
        g = runpy.run_path(str(SCRIPTS / "new_readers_and_mlperf_params.py"))
    said = " ".join(str(w.message) for w in caught)
    assert "async_param" in said and "hybrid_embedding_param" in said
    assert set(g["results"]) == {"Raw", "Parquet"}
    for metrics in g["results"].values():
        assert 0.0 <= dict(metrics)["AUC"] <= 1.0
    # the document's Raw reader (float_label_dense by default) reads the labels as 0 and 1
    from tierserve.trainer.data.reader import create_data_reader

    sparse = [g["hugectr"].DataReaderSparseParam("data1", 1, True, 4)]
    with create_data_reader(g["raw_reader"], 256, 1, 3, sparse, eval=True) as reader:
        batch = reader.read_a_batch()
    assert set(np.unique(batch.label)) <= {0.0, 1.0} and np.isfinite(batch.dense).all()


def test_new_data_source(tmp_path, monkeypatch):
    remote = tmp_path / "remote"
    (remote / "train").mkdir(parents=True)
    (remote / "train" / "0.data").write_bytes(b"\x01\x02")
    (remote / "file_list.txt").write_text("1\n./train/0.data\n")
    (remote / "wdl_0_sparse_4000.model").mkdir()
    (remote / "wdl_0_sparse_4000.model" / "key").write_bytes(b"\x00" * 8)
    run("new_data_source", tmp_path, monkeypatch)
    assert (tmp_path / "local" / "train" / "0.data").read_bytes() == b"\x01\x02"
    assert (tmp_path / "local" / "file_list.txt").exists()
    assert (tmp_path / "local" / "wdl_0_sparse_4000.model" / "key").exists()


def test_the_trainer_imports_the_server_only_when_a_script_touches_inference():
    import subprocess
    import sys

    code = ("import sys, tierserve.trainer as hugectr\n"
            "before = any(m.startswith('tierserve.server') for m in sys.modules)\n"
            "hugectr.inference.InferenceParams\n"
            "after = any(m.startswith('tierserve.server') for m in sys.modules)\n"
            "print(before, after)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "True"]
