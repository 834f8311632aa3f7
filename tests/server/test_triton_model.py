"""server/triton_model's runtime without tritonserver: requests of one Triton call run merged,
a bad request fails alone with tierserve's message, nothing of the front ends is imported.
(tests/integration/test_server_triton_backend.py runs it inside a real tritonserver.)"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tierserve.clients.demo_model import SLOT_SIZES
from tierserve.core.errors import CorruptModelFileError
from tierserve.server.triton_model import RequestError, TritonRuntime, model_parameters

SLOTS = len(SLOT_SIZES)


def _hash_map_only(repo):
    config = json.loads((repo / "ps.json").read_text())
    del config["persistent_db"]
    (repo / "ps.json").write_text(json.dumps(config))
    return repo


@pytest.fixture
def runtime(tiny_repository):
    repo = _hash_map_only(tiny_repository(max_batch_size=64))
    rt = TritonRuntime("dlrm", "1", repo / "dlrm" / "1", repo / "ps.json")
    yield rt
    rt.close()


def _request(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = np.stack([rng.integers(0, n, rows) for n in SLOT_SIZES], axis=1)
    keys += np.concatenate([[0], np.cumsum(SLOT_SIZES[:-1])])
    return {"DES": rng.random((rows, 13), dtype=np.float32), "CATCOLUMN": keys.astype(np.int64)}


def test_requests_run_merged_and_a_bad_one_fails_alone(runtime):
    requests = [_request(3, 1), _request(1, 2), _request(5, 3), _request(2, 4)]
    alone = [runtime.infer([r])[0]["OUTPUT0"] for r in requests]
    bad = dict(requests[1], CATCOLUMN=requests[1]["CATCOLUMN"][:, :5])
    nan = dict(requests[2], DES=np.full((5, 13), np.nan, np.float32))
    results = runtime.infer([requests[0], bad, nan, requests[3], requests[1], requests[2]])
    np.testing.assert_allclose(results[0]["OUTPUT0"], alone[0], atol=1e-6)
    np.testing.assert_allclose(results[3]["OUTPUT0"], alone[3], atol=1e-6)
    np.testing.assert_allclose(results[4]["OUTPUT0"], alone[1], atol=1e-6)
    np.testing.assert_allclose(results[5]["OUTPUT0"], alone[2], atol=1e-6)
    assert isinstance(results[1], RequestError) and results[1].http_status == 400
    assert "CATCOLUMN" in results[1].message and str(SLOTS) in results[1].message
    assert isinstance(results[2], RequestError) and "DES" in results[2].message


def test_merged_executions_stay_within_max_batch_size(runtime):
    calls = []
    execute = runtime.servable.execute

    def counting(unit):
        calls.append(unit.batch_size)
        return execute(unit)

    runtime.servable.execute = counting  # counts the merged executions of the real servable
    requests = [_request(40, 1), _request(20, 2), _request(30, 3), _request(64, 4)]
    results = runtime.infer(requests)
    assert calls == [60, 30, 64]
    for request, result in zip(requests, results):
        assert result["OUTPUT0"].shape == (request["DES"].shape[0], 1)
        np.testing.assert_allclose(
            result["OUTPUT0"], execute(runtime.servable.prepare(request))["OUTPUT0"], atol=1e-6
        )


def test_embedding_store_answers_and_refuses(tiny_repository):
    repo = _hash_map_only(tiny_repository())
    store = repo / "store" / "1"
    store.mkdir(parents=True)
    sparse = next((repo / "dlrm" / "1").glob("*_sparse_*.model"))
    (store / sparse.name).symlink_to(sparse)
    config = json.loads((repo / "ps.json").read_text())
    entry = dict(config["models"][0], model="store", dense_file="", network_file="")
    config["models"].append(entry)
    (repo / "ps.json").write_text(json.dumps(config))
    rt = TritonRuntime("store", "1", store, repo / "ps.json")
    try:
        keys = np.array([0, 1, 2**40], np.int64)
        good = {"KEYS": keys, "NUMKEYS": np.array([3], np.int32)}
        results = rt.infer([good, {"KEYS": keys, "NUMKEYS": np.array([2], np.int32)}])
        assert results[0]["OUTPUT0"].shape == (3 * 16,)
        np.testing.assert_array_equal(results[0]["OUTPUT0"][32:], 0.0)  # unknown key: default
        assert isinstance(results[1], RequestError) and "NUMKEYS" in results[1].message
    finally:
        rt.close()


def test_a_version_that_cannot_load_raises_tierserve_reason(tiny_repository):
    repo = _hash_map_only(tiny_repository())
    dense = next((repo / "dlrm" / "1").glob("*_dense_*.model"))
    dense.write_bytes(dense.read_bytes()[:-4])
    with pytest.raises(CorruptModelFileError, match=dense.name):
        TritonRuntime("dlrm", "1", repo / "dlrm" / "1", repo / "ps.json")


def test_model_parameters_reads_string_values():
    config = {"parameters": {"ps_config": {"string_value": "/m/ps.json"}, "x": {}}}
    assert model_parameters(config) == {"ps_config": "/m/ps.json", "x": ""}
    assert model_parameters({}) == {}


def test_the_triton_model_imports_no_front_end():
    code = (
        "import sys, tierserve.server.triton_model\n"
        "print([m for m in sys.modules if m.startswith(('tierserve.server.app', "
        "'tierserve.server.http.rest', 'tierserve.server.grpc.aio', 'fastapi', 'uvicorn', "
        "'grpc'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_instance_kind_selects_where_the_cache_lives():
    from tierserve.core.errors import ConfigError
    from tierserve.server.triton_model import _select_device

    assert _select_device("CPU", "0") is False  # KIND_CPU: host memory whatever ps.json says
    try:
        import cupy  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="KIND_GPU needs cupy"):
            _select_device("GPU", "0")
