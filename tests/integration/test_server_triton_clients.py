"""The running server driven by the real tritonclient.http and tritonclient.grpc.

One small DLRM is trained with the embedded trainer, written into a model repository (hash
map + RocksDB tiers) and served on 127.0.0.1 free ports.  Results are compared with
InferenceModel.predict on the same rows.
"""

from __future__ import annotations

import gzip
import json
import shutil
import threading

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tg
import tritonclient.http as th
from http_transports import TRANSPORTS
from tritonclient.utils import InferenceServerException

from tierserve.clients.demo_model import train_demo_model, write_repository
from tierserve.server.app import BackgroundServer
from tierserve.server.inference_model import InferenceParams
from tierserve.server.settings import Settings
from tierserve.trainer.hugectr.inference_data import wrapped_batches
from tierserve.trainer.hugectr.inference_model import InferenceModel

TOKEN = "s3cret"
BATCH = 64


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    work = tmp_path_factory.mktemp("demo")
    model = train_demo_model(work / "train", iterations=40, batch_size=256)
    repo = work / "repo"
    write_repository(model, repo, max_batch_size=256)
    # An embedding-lookup model: the same table, no graph.
    shutil.copytree(model.sparse_files[0], repo / "emb" / "1" / model.sparse_files[0].name)
    config = json.loads((repo / "ps.json").read_text())
    entry = dict(config["models"][0], model="emb", network_file="", dense_file="",
                 sparse_files=[model.sparse_files[0].name],
                 default_value_for_each_table=[0.5])  # fmt: skip
    config["models"].append(entry)
    (repo / "ps.json").write_text(json.dumps(config))
    return model, repo


@pytest.fixture(scope="module", params=TRANSPORTS)
def server(demo, request):
    """The server, once per HTTP transport (tritonclient's HTTP client against each)."""
    _, repo = demo
    settings = Settings.build(
        model_repository=repo, http_port=0, grpc_port=0, admin_token=TOKEN, poll_interval_s=0,
        max_request_bytes=4 * 1024 * 1024, http_transport=request.param,
    )  # fmt: skip
    with BackgroundServer(settings) as srv:
        yield srv


@pytest.fixture(scope="module")
def rows(demo):
    """One batch of the training split and InferenceModel.predict's answer for it."""
    model, _ = demo
    params = InferenceParams(
        "dlrm", BATCH, 0.9, str(model.dense_file), [str(f) for f in model.sparse_files],
        False, 0.5, True, volatile_db={"type": "hash_map"},
    )  # fmt: skip
    reference = InferenceModel(str(model.graph), params)
    try:
        expected = reference.predict(1, model.data_source, "Norm", "Sum")
        batch = next(
            iter(wrapped_batches(reference.graph, model.data_source, "Norm", "Sum", None, BATCH, 1))
        )
    finally:
        reference.close()
    cat = batch.sparse[0].keys.reshape(BATCH, -1)
    trainer = np.asarray(model.model.predict_batch(batch))
    np.testing.assert_allclose(expected, trainer, atol=1e-5)  # InferenceModel == trainer
    return batch.dense.astype(np.float32), cat.astype(np.int64), expected


def _http_inputs(des, cat, binary):
    a = th.InferInput("DES", list(des.shape), "FP32")
    a.set_data_from_numpy(des, binary_data=binary)
    b = th.InferInput("CATCOLUMN", list(cat.shape), "INT64")
    b.set_data_from_numpy(cat, binary_data=binary)
    return [a, b]


def _grpc_inputs(des, cat):
    a = tg.InferInput("DES", list(des.shape), "FP32")
    a.set_data_from_numpy(des)
    b = tg.InferInput("CATCOLUMN", list(cat.shape), "INT64")
    b.set_data_from_numpy(cat)
    return [a, b]


def test_health_and_metadata(server):
    h = th.InferenceServerClient(server.http_url)
    g = tg.InferenceServerClient(server.grpc_url)
    assert h.is_server_live() and h.is_server_ready()
    assert g.is_server_live() and g.is_server_ready()
    assert h.is_model_ready("dlrm") and g.is_model_ready("dlrm")
    assert h.is_model_ready("dlrm", "1") and not g.is_model_ready("dlrm", "7")
    assert h.get_server_metadata()["name"] == "tierserve"
    assert "model_repository" in g.get_server_metadata().extensions
    meta = h.get_model_metadata("dlrm")
    assert meta["versions"] == ["1"]
    assert {i["name"]: i["shape"] for i in meta["inputs"]}["DES"] == [-1, 13]
    gmeta = g.get_model_metadata("dlrm", as_json=True)
    assert [o["name"] for o in gmeta["outputs"]] == ["OUTPUT0"]
    config = g.get_model_config("dlrm").config
    assert config.max_batch_size == 256 and config.input[0].name == "DES"
    assert h.get_model_config("dlrm")["max_batch_size"] == 256


@pytest.mark.parametrize("binary", [True, False])
def test_http_infer_equals_predict(server, rows, binary):
    des, cat, expected = rows
    client = th.InferenceServerClient(server.http_url)
    outputs = [th.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    result = client.infer("dlrm", _http_inputs(des, cat, binary), outputs=outputs)
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected, atol=1e-5)


def test_grpc_infer_equals_predict(server, rows):
    des, cat, expected = rows
    client = tg.InferenceServerClient(server.grpc_url)
    result = client.infer("dlrm", _grpc_inputs(des, cat), model_version="1")
    assert result.get_response().model_version == "1"
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected, atol=1e-5)


def test_csr_rowindex_and_plain_predict_route(server, rows):
    des, cat, expected = rows
    n = 4
    client = th.InferenceServerClient(server.http_url)
    rowindex = np.arange(n * cat.shape[1] + 1, dtype=np.int32)
    inputs = _http_inputs(des[:n], cat[:n].reshape(1, -1), True)
    r = th.InferInput("ROWINDEX", [rowindex.size], "INT32")
    r.set_data_from_numpy(rowindex)
    result = client.infer("dlrm", [*inputs, r])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected[:n], atol=1e-5)
    body = {"model": "dlrm", "inputs": {"DES": des[:2].tolist(), "CATCOLUMN": cat[:2].tolist()}}
    answer = httpx.post(f"http://{server.http_url}/predict", json=body).json()
    np.testing.assert_allclose(answer["outputs"]["OUTPUT0"], expected[:2], atol=1e-5)


def test_gzip_body(server, rows):
    des, cat, expected = rows
    body = {
        "inputs": [
            {"name": "DES", "datatype": "FP32", "shape": [1, 13], "data": des[0].tolist()},
            {"name": "CATCOLUMN", "datatype": "INT64", "shape": [1, 8], "data": cat[0].tolist()},
        ]
    }
    r = httpx.post(
        f"http://{server.http_url}/v2/models/dlrm/infer",
        content=gzip.compress(json.dumps(body).encode()),
        headers={"Content-Encoding": "gzip"},
    )
    assert r.status_code == 200, r.text
    assert abs(r.json()["outputs"][0]["data"][0] - expected[0, 0]) < 1e-5


def test_bad_input_is_4xx_and_server_keeps_serving(server, rows):
    des, cat, expected = rows
    h = th.InferenceServerClient(server.http_url)
    g = tg.InferenceServerClient(server.grpc_url)
    url = f"http://{server.http_url}/v2/models"

    with pytest.raises(InferenceServerException) as e:
        h.infer("nope", _http_inputs(des, cat, True))
    assert e.value.status() == "404"
    with pytest.raises(InferenceServerException) as e:
        g.infer("nope", _grpc_inputs(des, cat))
    assert e.value.status() == "StatusCode.NOT_FOUND"
    assert httpx.get(f"{url}/..%2F..%2Fetc/ready").status_code in (404, 400)

    wrong = [_grpc_inputs(des, cat)[0], tg.InferInput("CATCOLUMN", list(cat.shape), "INT32")]
    wrong[1].set_data_from_numpy(cat.astype(np.int32))
    with pytest.raises(InferenceServerException) as e:
        g.infer("dlrm", wrong)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "CATCOLUMN" in e.value.message() and "INT64" in e.value.message()

    bad_shape = _http_inputs(des[:, :5].copy(), cat, True)
    with pytest.raises(InferenceServerException) as e:
        h.infer("dlrm", bad_shape)
    assert e.value.status() == "400"
    assert "'DES'" in e.value.message() and "[-1, 13]" in e.value.message()

    big = np.repeat(des, 5, axis=0)  # 320 rows > max_batch_size 256
    with pytest.raises(InferenceServerException) as e:
        h.infer("dlrm", _http_inputs(big, np.repeat(cat, 5, axis=0), True))
    assert e.value.status() == "400" and "max_batch_size" in e.value.message()

    r = httpx.post(f"{url}/dlrm/infer", content=b'{"inputs": [')
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]

    header = json.dumps({"inputs": [
        {"name": "DES", "datatype": "FP32", "shape": [1, 13],
         "parameters": {"binary_data_size": 52}},
    ]}).encode()  # fmt: skip
    r = httpx.post(
        f"{url}/dlrm/infer",
        content=header + b"\0" * 20,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert r.status_code == 400 and "truncated" in r.json()["error"]

    r = httpx.post(f"{url}/dlrm/infer", content=b"x" * (5 * 1024 * 1024))
    assert r.status_code == 413

    # still serving
    result = h.infer("dlrm", _http_inputs(des, cat, True))
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected, atol=1e-5)


def test_repository_load_unload_with_token(server, rows):
    des, cat, expected = rows
    h = th.InferenceServerClient(server.http_url)
    g = tg.InferenceServerClient(server.grpc_url)
    index = h.get_model_repository_index()
    assert {"name": "dlrm", "version": "1", "state": "READY", "reason": ""} in index
    with pytest.raises(InferenceServerException) as e:
        h.unload_model("dlrm")
    assert e.value.status() == "401"
    with pytest.raises(InferenceServerException) as e:
        g.unload_model("dlrm", headers={"authorization": "Bearer wrong"})
    assert e.value.status() == "StatusCode.UNAUTHENTICATED"
    g.unload_model("dlrm", headers={"authorization": f"Bearer {TOKEN}"})
    assert not g.is_model_ready("dlrm")
    assert g.get_model_repository_index().models[0].state == "UNAVAILABLE"
    h.load_model("dlrm", headers={"Authorization": f"Bearer {TOKEN}"})
    assert h.is_model_ready("dlrm")
    result = g.infer("dlrm", _grpc_inputs(des, cat))
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected, atol=1e-5)
    stats = g.get_inference_statistics("dlrm", as_json=True)
    assert stats["model_stats"][0]["name"] == "dlrm"


def test_concurrent_clients_are_batched(server, rows):
    des, cat, expected = rows
    errors: list[BaseException] = []

    def client(i: int) -> None:
        try:
            c = th.InferenceServerClient(server.http_url)
            for k in range(4):
                j = (i + k) % BATCH
                result = c.infer("dlrm", _http_inputs(des[j : j + 1], cat[j : j + 1], True))
                np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected[j : j + 1],
                                           atol=1e-5)  # fmt: skip
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    metrics = httpx.get(f"http://{server.http_url}/metrics").text
    requests_per_batch = [
        line for line in metrics.splitlines()
        if line.startswith('tierserve_batch_requests_bucket{le="1.0",model="dlrm"}')
        or line.startswith('tierserve_batch_requests_count{model="dlrm"}')
    ]  # fmt: skip
    single, total = (float(line.rsplit(" ", 1)[1]) for line in requests_per_batch)
    assert single < total, "no execution merged more than one request"
    assert "tierserve_tier_latency_seconds_bucket" in metrics
    assert 'tierserve_requests_total{model="dlrm",protocol="http"}' in metrics


def test_embedding_lookup_model(demo, server):
    from tierserve.ps.sparse_file import read_sparse_model

    model, _ = demo
    table = read_sparse_model(model.sparse_files[0], 16)
    keys = np.concatenate([np.asarray(table.keys[:5]), [-7]]).astype(np.int64)
    expected = np.concatenate([np.asarray(table.embeddings[:5]), np.full((1, 16), 0.5)])
    h = th.InferenceServerClient(server.http_url)
    g = tg.InferenceServerClient(server.grpc_url)
    assert [i["name"] for i in h.get_model_metadata("emb")["inputs"]] == ["KEYS", "NUMKEYS"]
    k = th.InferInput("KEYS", [6], "INT64")
    k.set_data_from_numpy(keys)
    n = th.InferInput("NUMKEYS", [1], "INT32")
    n.set_data_from_numpy(np.array([6], np.int32))
    out = h.infer("emb", [k, n]).as_numpy("OUTPUT0")
    np.testing.assert_allclose(out.reshape(6, 16), expected, atol=1e-7)
    k = tg.InferInput("KEYS", [6], "INT64")
    k.set_data_from_numpy(keys)
    n = tg.InferInput("NUMKEYS", [1], "INT32")
    n.set_data_from_numpy(np.array([5], np.int32))  # does not add up to the 6 keys
    with pytest.raises(InferenceServerException) as e:
        g.infer("emb", [k, n])
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT" and "NUMKEYS" in e.value.message()
