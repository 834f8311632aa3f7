"""The HugeCTR-style DLRM, DCN, Wide&Deep and DIN scripts train on generated data (a planted
model), save with save_params_to_files, reload with construct_from_json + load_*_weights and
predict the same; the serving forward (InferenceGraph) matches the trainer's."""

from __future__ import annotations

import numpy as np
import pytest

from tierserve.model.dense_file import dense_model_name
from tierserve.model.inference_graph import InferenceGraph

from .script_runner import embeddings_for, eval_batch, run_script

COMMON = dict(MAX_ITER=120, BATCH=1024, EVAL_BATCH=4096, EVAL_BATCHES=2, NUM_FILES=4,
              SAMPLES_PER_FILE=8192, SLOT_SIZES=",".join(["1000"] * 26))


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("generated")


# Wide&Deep reads int32 keys (i64_input_key=False), the others int64.
@pytest.mark.parametrize("name,i64", [("dlrm", 1), ("dcn", 1), ("wdl", 0), ("din", 1)])
def test_script_trains_saves_and_reloads(name, i64, data_root, tmp_path, monkeypatch):
    out = tmp_path / "out"
    data = data_root / ("din" if name == "din" else f"i64_{i64}")
    g = run_script(name, monkeypatch, DATA_DIR=data, OUT_DIR=out, I64=i64, **COMMON)
    model, reloaded = g["model"], g["reloaded"]
    auc = g["metrics"]["AUC"]
    print(f"{name}: generated-data AUC {auc:.4f}")
    assert auc >= 0.75, f"{name}: AUC {auc:.4f} on planted-model data"
    assert g["reloaded_metrics"]["AUC"] == pytest.approx(auc, abs=1e-6)

    batch = eval_batch(model)
    before = model.predict_batch(batch)
    after = reloaded.predict_batch(batch)
    assert before.shape == (batch.batch_size, 1)
    assert np.abs(before - after).max() <= 1e-6

    served = InferenceGraph(out / f"{name}.json",
                            dense_model_name(str(out / name), COMMON["MAX_ITER"]))
    scores = served.predict(batch.dense, embeddings_for(model, batch))
    assert np.abs(scores - before).max() <= 1e-5
    if name == "din":  # no dense features
        scores = served.predict(None, embeddings_for(model, batch))
        assert np.abs(scores - before).max() <= 1e-5
