"""The scripts of HugeCTR's two Python interface documents run with one import changed
(issue 13): tests/trainer/hugectr_scripts/, each in a scratch folder holding the data and
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

from tierserve.trainer.blas_threads import blas_threads

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


def test_scripts_import_tierserve_where_the_documents_import_hugectr():
    import re

    for path in sorted(SCRIPTS.glob("*.py")):
        text = path.read_text()
        assert not re.search(r"^\s*(import|from) hugectr", text, re.M), path.name
        assert re.search(r"^(import|from) tierserve\.trainer", text, re.M), path.name
