"""DLRM, DCN and Wide&Deep (the HugeCTR-style example scripts) on the Criteo sample: first
6,000 rows to train, last 2,000 to evaluate, converted with the Criteo converter.  A hashed
logistic regression scores about 0.73 there; each model must reach 0.70."""

from __future__ import annotations

import pytest
from shared_data import CRITEO_SAMPLE, require

from tierserve.trainer.data.criteo import convert_criteo

from .script_runner import run_script

# Per model: learning rate, iterations of 256 samples (~43 per epoch), extra settings.
SETTINGS = {
    "dlrm": dict(LR=0.001, MAX_ITER=120),
    "dcn": dict(LR=0.002, MAX_ITER=96, CROSS_LAYERS=2, EMB_DIM=8),
    "wdl": dict(LR=0.001, MAX_ITER=72),
}


@pytest.fixture(scope="module")
def criteo_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("criteo")
    # Values seen fewer than 10 times in the training rows share the "rare" key: 6,000 rows
    # cannot train an embedding per rare value.
    convert_criteo(require(CRITEO_SAMPLE), out, train_rows=6000, eval_rows=2000, min_frequency=10)
    return out


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_model_reaches_auc_070_on_criteo(name, criteo_dir, tmp_path, monkeypatch):
    g = run_script(name, monkeypatch, DATA_DIR=criteo_dir, OUT_DIR=tmp_path, I64=1, BATCH=256,
                   EVAL_BATCH=1000, EVAL_BATCHES=2, **SETTINGS[name])
    auc = g["metrics"]["AUC"]
    print(f"{name}: Criteo AUC {auc:.4f}")
    assert auc >= 0.70, f"{name}: AUC {auc:.4f} on the Criteo sample"
    assert g["reloaded_metrics"]["AUC"] == pytest.approx(auc, abs=1e-6)
