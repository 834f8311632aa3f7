"""What model metadata and model config present for every kind of model, over HTTP and gRPC,
and Triton's own load generator, ``perf_analyzer``, driving the server with it.

perf_analyzer builds its requests from the metadata (input names, datatypes, shapes) and the
config (``max_batch_size``: whether the first dimension is the batch; ``optional``): a
one-hot ranking model must present only ``DES`` and ``CATCOLUMN`` with fixed row shapes (it
then runs with perf_analyzer's own data); a multi-hot model, an embedding store and an
Estimator export present whole-request shapes (``max_batch_size`` 0) and run with
``--input-data`` (tests/services/perf_analyzer.py writes it).

Models: the session's tiny one-hot DLRM and an embedding store over its table (64-bit keys),
a multi-hot model with 32-bit keys, and an Estimator export (numeric, embedding and
multi-valued columns).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from services.install import InstallError
from services.perf_analyzer import ensure_perf_analyzer, write_input_data
from triton_models import (
    MH_DENSE,
    MH_NNZ,
    MH_SLOTS,
    copy_version,
    from_demo,
    model_entry,
    train_multi_hot32,
    write_ps_json,
)

from tierserve.clients.demo_model import DENSE_DIM, SLOT_SIZES
from tierserve.server.app import BackgroundServer
from tierserve.server.settings import Settings

SLOTS = len(SLOT_SIZES)
RNG = np.random.default_rng(11)


def _estimator_repository(root: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """An Estimator export (``reg``: numeric x, embedding k, multi-valued m) and one request
    of it with rows of 0 to 3 ids in m."""
    from tierserve.trainer import estimator
    from tierserve.trainer import feature_column as fc
    from tierserve.trainer.estimator import export

    n = 64
    features = {
        "x": RNG.normal(size=n).astype(np.float32),
        "k": RNG.choice(["a", "b", "c"], n),
        "m": [list(RNG.choice(["u", "v", "w"], RNG.integers(0, 4))) for _ in range(n)],
    }
    k = fc.categorical_column_with_vocabulary_list("k", ["a", "b", "c"])
    m = fc.categorical_column_with_vocabulary_list("m", ["u", "v", "w"])
    regressor = estimator.DNNRegressor(
        [4], [fc.numeric_column("x"), fc.embedding_column(k, 3), fc.embedding_column(m, 3)],
        model_dir=str(root / "reg"),
    )  # fmt: skip
    regressor.train(lambda: (features, features["x"] * 2), steps=5)
    receiver = export.build_raw_serving_input_receiver_fn({
        "x": export.placeholder(np.float32, [None]), "k": export.placeholder(str, [None]),
        "m": export.sparse_placeholder(str)})  # fmt: skip
    repo = root / "estimator"
    version = regressor.export_saved_model(str(repo), receiver).decode()
    request = export.encode_request(version, {key: v[:6] for key, v in features.items()})
    assert "ROWINDEX" in request
    return repo, request


def _csr_request(rows: int, slots: int, dense: int, dtype) -> dict[str, np.ndarray]:
    """A multi-hot request of one table: 1 to MH_NNZ keys per slot."""
    counts = RNG.integers(1, MH_NNZ + 1, size=rows * slots)
    return {
        "DES": RNG.normal(size=(rows, dense)).astype(np.float32),
        "CATCOLUMN": RNG.integers(0, 100, size=int(counts.sum())).astype(dtype),
        "ROWINDEX": np.concatenate([[0], np.cumsum(counts)]).astype(np.int32),
    }


class Servers:
    """Three servers (the models need different ``supportlonglong`` and repositories)."""

    def __init__(self, root: Path, demo) -> None:
        dlrm = from_demo(demo)
        repo64 = root / "repo64"
        copy_version(dlrm, repo64 / "dlrm" / "1")
        copy_version(dlrm, repo64 / "store" / "1", graph=False)
        store = model_entry("store", dlrm, SLOTS, 16, SLOTS)
        store.update(dense_file="", network_file="")
        write_ps_json(repo64, [model_entry("dlrm", dlrm, SLOTS, 16, SLOTS), store],
                      supportlonglong=True)  # fmt: skip
        mh32 = train_multi_hot32(root / "mh32")
        repo32 = root / "repo32"
        copy_version(mh32, repo32 / "mh32" / "1")
        write_ps_json(repo32, [model_entry("mh32", mh32, MH_SLOTS, 8, MH_SLOTS * MH_NNZ)],
                      supportlonglong=False)  # fmt: skip
        estimator_repo, self.estimator_request = _estimator_repository(root)
        self.servers = {}
        for key, repo in (("64", repo64), ("32", repo32), ("est", estimator_repo)):
            settings = Settings.build(model_repository=repo, http_port=0, grpc_port=0,
                                      poll_interval_s=0)  # fmt: skip
            self.servers[key] = BackgroundServer(settings).start(timeout=120)
        self.of_model = {"dlrm": "64", "store": "64", "mh32": "32", "reg": "est"}

    def server(self, model: str) -> BackgroundServer:
        return self.servers[self.of_model[model]]

    def presented(self, model: str) -> list[tuple[dict, dict]]:
        """(metadata, config) of ``model`` as tritonclient reads them over HTTP and gRPC."""
        server = self.server(model)
        h = th.InferenceServerClient(server.http_url)
        g = tg.InferenceServerClient(server.grpc_url)
        try:
            return [
                (h.get_model_metadata(model), h.get_model_config(model)),
                (g.get_model_metadata(model, as_json=True),
                 g.get_model_config(model, as_json=True)["config"]),
            ]  # fmt: skip
        finally:
            h.close()
            g.close()

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tiny_dlrm):
    servers = Servers(tmp_path_factory.mktemp("interface"), tiny_dlrm)
    yield servers
    servers.stop()


def _tensors(meta: dict, key: str) -> list[tuple[str, str, list[int]]]:
    return [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta[key]]


def _config_tensors(config: dict, key: str) -> list[tuple[str, str, list[int], bool]]:
    """name, data_type, dims, optional (gRPC's JSON gives int64 dims as strings)."""
    return [(t["name"], t["data_type"], [int(d) for d in t.get("dims", [])],
             bool(t.get("optional", False))) for t in config[key]]  # fmt: skip


def test_a_one_hot_model_presents_des_and_catcolumn_with_a_batch_dimension(servers):
    for meta, config in servers.presented("dlrm"):
        assert _tensors(meta, "inputs") == [("DES", "FP32", [-1, DENSE_DIM]),
                                            ("CATCOLUMN", "INT64", [-1, SLOTS])]  # fmt: skip
        assert _tensors(meta, "outputs") == [("OUTPUT0", "FP32", [-1, 1])]
        assert int(config["max_batch_size"]) == 256  # model_entry's
        assert _config_tensors(config, "input") == [
            ("DES", "TYPE_FP32", [DENSE_DIM], False),
            ("CATCOLUMN", "TYPE_INT64", [SLOTS], False),
        ]
        assert _config_tensors(config, "output") == [("OUTPUT0", "TYPE_FP32", [1], False)]
        assert "dynamic_batching" in config


def test_a_one_hot_model_still_takes_rowindex_on_every_route(servers):
    """ROWINDEX is not presented (it has no row shape) but HugeCTR's clients send it."""
    url = servers.server("dlrm").http_url
    des = RNG.normal(size=(2, DENSE_DIM)).astype(np.float32)
    cat = RNG.integers(0, 300, size=(2, SLOTS))
    one_hot = httpx.post(f"http://{url}/predict", timeout=30, json={
        "model": "dlrm", "inputs": {"DES": des.tolist(), "CATCOLUMN": cat.tolist()}})  # fmt: skip
    csr = httpx.post(f"http://{url}/predict", timeout=30, json={"model": "dlrm", "inputs": {
        "DES": des.tolist(), "CATCOLUMN": cat.reshape(-1).tolist(),
        "ROWINDEX": list(range(2 * SLOTS + 1))}})  # fmt: skip
    assert one_hot.status_code == 200 and csr.status_code == 200, (one_hot.text, csr.text)
    assert csr.json()["outputs"] == one_hot.json()["outputs"]


def test_a_multi_hot_model_presents_csr_inputs_without_a_batch_dimension(servers):
    for meta, config in servers.presented("mh32"):
        assert _tensors(meta, "inputs") == [
            ("DES", "FP32", [-1, MH_DENSE]), ("CATCOLUMN", "INT32", [-1]),
            ("ROWINDEX", "INT32", [-1])]  # fmt: skip
        assert _tensors(meta, "outputs") == [("OUTPUT0", "FP32", [-1, 1])]
        assert int(config.get("max_batch_size", 0)) == 0
        assert _config_tensors(config, "input") == [
            ("DES", "TYPE_FP32", [-1, MH_DENSE], False), ("CATCOLUMN", "TYPE_INT32", [-1], False),
            ("ROWINDEX", "TYPE_INT32", [-1], False)]  # fmt: skip
        assert "dynamic_batching" not in config


def test_an_embedding_store_presents_keys_and_numkeys(servers):
    for meta, config in servers.presented("store"):
        assert _tensors(meta, "inputs") == [("KEYS", "INT64", [-1]), ("NUMKEYS", "INT32", [1])]
        assert int(config.get("max_batch_size", 0)) == 0
        assert _config_tensors(config, "input") == [
            ("KEYS", "TYPE_INT64", [-1], False),
            ("NUMKEYS", "TYPE_INT32", [1], False),
        ]


def test_an_estimator_export_presents_its_request_shapes(servers):
    """Its columns may give a row several ids or none: CSR inputs, as a multi-hot model."""
    request = servers.estimator_request
    width = request["DES"].shape[1]
    for meta, config in servers.presented("reg"):
        assert _tensors(meta, "inputs") == [
            ("DES", "FP32", [-1, width]),
            ("CATCOLUMN", "INT64", [-1]),
            ("ROWINDEX", "INT32", [-1]),
        ]
        assert int(config.get("max_batch_size", 0)) == 0


def test_statistics_count_every_request_in_queue_and_compute(servers):
    """perf_analyzer finds the version it measured by the ``queue`` count."""
    server = servers.server("dlrm")
    client = th.InferenceServerClient(server.http_url)
    before = client.get_inference_statistics("dlrm")["model_stats"][0]["inference_stats"]
    inputs = [
        th.InferInput("DES", [1, DENSE_DIM], "FP32"),
        th.InferInput("CATCOLUMN", [1, SLOTS], "INT64"),
    ]
    inputs[0].set_data_from_numpy(np.zeros((1, DENSE_DIM), np.float32))
    inputs[1].set_data_from_numpy(np.ones((1, SLOTS), np.int64))
    for _ in range(3):
        client.infer("dlrm", inputs)
    after = client.get_inference_statistics("dlrm")["model_stats"][0]["inference_stats"]
    client.close()
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert after[key]["count"] - before[key]["count"] == 3, key
    assert after["compute_input"]["ns"] > before["compute_input"]["ns"]


# --- perf_analyzer ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def perf_analyzer():
    try:
        return ensure_perf_analyzer()
    except InstallError as exc:
        pytest.skip(f"perf_analyzer's libraries cannot be installed here: {exc}")


#: Short runs: a few counted requests per window, any spread of latencies taken as stable.
SHORT = ["--measurement-mode", "count_windows", "--measurement-request-count", "20",
         "--stability-percentage", "1000", "--max-trials", "5"]  # fmt: skip


def _requests(servers, model: str) -> list[dict[str, np.ndarray]]:
    if model == "mh32":
        return [_csr_request(rows, MH_SLOTS, MH_DENSE, np.int32) for rows in (1, 3, 8)]
    if model == "store":
        return [{"KEYS": RNG.integers(0, 1000, size=n).astype(np.int64),
                 "NUMKEYS": np.array([n], np.int32)} for n in (1, 5, 40)]  # fmt: skip
    return [servers.estimator_request]


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_drives_a_one_hot_model_with_its_own_data(servers, perf_analyzer, protocol):
    server = servers.server("dlrm")
    url = server.http_url if protocol == "http" else server.grpc_url
    rows = perf_analyzer.run(["-m", "dlrm", "-u", url, "-i", protocol, "-b", "4",
                              "--concurrency-range", "1:2", *SHORT])  # fmt: skip
    assert [r.concurrency for r in rows] == [1, 2]
    assert all(r.throughput > 0 and r.p99_ms >= r.p50_ms > 0 for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["mh32", "store", "reg"])
def test_perf_analyzer_drives_whole_request_models_with_input_data(
    servers, perf_analyzer, protocol, model, tmp_path
):
    server = servers.server(model)
    url = server.http_url if protocol == "http" else server.grpc_url
    data = write_input_data(tmp_path / "data.json", _requests(servers, model))
    rows = perf_analyzer.run(["-m", model, "-u", url, "-i", protocol, "--input-data", str(data),
                              "--concurrency-range", "2", *SHORT])  # fmt: skip
    assert rows[0].concurrency == 2 and rows[0].throughput > 0
    stats = httpx.get(f"http://{server.http_url}/v2/models/{model}/stats").json()
    inference = stats["model_stats"][0]["inference_stats"]
    assert inference["success"]["count"] >= 20 and inference["fail"]["count"] == 0, json.dumps(
        inference
    )
