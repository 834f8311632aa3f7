"""``tierserve evaluate`` / ``predict`` on a model trained with 32-bit keys (issue 13)."""

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
