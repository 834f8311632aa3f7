"""A DLRM trained on the Criteo sample (6,000 rows) and served with its table stored as
float32, float16 and int8 (``storage_dtype``): the held-out AUC (the last 2,000 rows) of the
served model moves by at most 0.0002 (float16) and 0.001 (int8).

The model is served as the server serves it: a ``ps.json`` model entry staged in a
hierarchical parameter server (hash map tier), with its embedding cache.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from shared_data import CRITEO_SAMPLE, require

from tierserve.model.graph_json import load_graph_json
from tierserve.ps.config import PSConfig
from tierserve.ps.hash_map import HashMapConfig
from tierserve.ps.hierarchy import HierarchicalParameterServer
from tierserve.server.inference_model import InferenceGraph, InferenceParams
from tierserve.server.inference_params import model_config_from_params
from tierserve.trainer.data.criteo import convert_criteo
from tierserve.trainer.hugectr.inference_model import InferenceModel  # evaluate over a dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))
from script_runner import run_script  # noqa: E402

MAX_ITER = 120
EVAL_ROWS = 2000
TOLERANCE = {"float16": 0.0002, "int8": 0.001}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    data = tmp_path_factory.mktemp("criteo")
    convert_criteo(require(CRITEO_SAMPLE), data, train_rows=6000, eval_rows=EVAL_ROWS,
                   min_frequency=10)  # fmt: skip
    out = tmp_path_factory.mktemp("dlrm")
    mp = pytest.MonkeyPatch()
    try:
        run_script("dlrm", mp, DATA_DIR=data, OUT_DIR=out, I64=1, BATCH=256, EVAL_BATCH=1000,
                   EVAL_BATCHES=2, LR=0.001, MAX_ITER=MAX_ITER)  # fmt: skip
    finally:
        mp.undo()
    return data, out


def _served_auc(trained, dtype: str) -> float:
    data, out = trained
    graph = out / "dlrm.json"
    params = InferenceParams(
        model_name="dlrm", max_batchsize=1000, hit_rate_threshold=0.9,
        dense_model_file=str(out / f"dlrm_dense_{MAX_ITER}.model"),
        sparse_model_files=[str(out / f"dlrm0_sparse_{MAX_ITER}.model")],
        use_gpu_embedding_cache=False, cache_size_percentage=0.5, i64_input_key=True,
    )  # fmt: skip
    network = InferenceGraph(load_graph_json(graph), params.dense_model_file, None)
    config = model_config_from_params(params, network, graph)
    config = config.updated("test", dense_file=params.dense_model_file, storage_dtype=dtype,
                            gpucache=True)  # fmt: skip
    with HierarchicalParameterServer(PSConfig(volatile_db=HashMapConfig(), models=[])) as ps:
        model = InferenceModel.from_config(config, ps, use_gpu_embedding_cache=False)
        try:
            model.commit()
            assert [s.codec.dtype.value for s in ps.model("dlrm").tables.values()] == [dtype]
            return model.evaluate(EVAL_ROWS // 1000, str(data / "file_list_test.txt"), "Norm", "Sum")
        finally:
            model.close()


def test_compact_rows_keep_the_served_auc(trained):
    auc = {dtype: _served_auc(trained, dtype) for dtype in ("float32", "float16", "int8")}
    print("served AUC on the held-out Criteo rows:", {k: round(v, 6) for k, v in auc.items()})
    assert auc["float32"] > 0.70
    for dtype, tol in TOLERANCE.items():
        assert abs(auc[dtype] - auc["float32"]) <= tol, (dtype, auc)
