"""Bad input gets a 4xx naming what was wrong, never a 500, over REST and gRPC.

A small real DLRM (tests/server/conftest.py) is served by a BackgroundServer on loopback;
requests are sent as raw JSON, binary-extension bodies and protobuf messages, so nothing on
the client side cleans them up first.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import grpc
import httpx
import numpy as np
import pytest

from tierserve.server.app import BackgroundServer, create_app
from tierserve.server.grpc.gen import grpc_predict_v2_pb2 as pb
from tierserve.server.runtime.tensors import DecodedRequest
from tierserve.server.settings import Settings

DES = [[0.1 * i for i in range(13)], [0.5] * 13]
pytestmark = pytest.mark.usefixtures("each_http_transport")

CAT = [[1, 1001, 1502, 3502, 3801, 3851, 4651, 4751], [7, 1007, 1507, 3507, 3807, 3857, 4657, 4757]]


def _json(*inputs, **extra) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def _input(name, datatype, shape, data):
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def _good(des=DES, cat=CAT, cat_type="INT64"):
    return (
        _input("DES", "FP32", [len(des), 13], des),
        _input("CATCOLUMN", cat_type, [len(cat), 8], cat),
    )


def _start(repo, **settings) -> BackgroundServer:
    values = dict(model_repository=repo, http_port=0, grpc_port=0, poll_interval_s=0)
    return BackgroundServer(Settings.build(**{**values, **settings})).start()


@pytest.fixture
def server(tiny_repository):
    srv = _start(tiny_repository())
    yield srv
    srv.stop()


def _post(server, body: bytes, path="/v2/models/dlrm/infer", headers=None) -> httpx.Response:
    return httpx.post(f"http://{server.http_url}{path}", content=body, headers=headers or {})


def _infer_stub(server):
    channel = grpc.insecure_channel(server.grpc_url)
    return channel, channel.unary_unary(
        "/inference.GRPCInferenceService/ModelInfer",
        request_serializer=pb.ModelInferRequest.SerializeToString,
        response_deserializer=pb.ModelInferResponse.FromString,
    )


def _expect_400(response: httpx.Response, *words: str) -> str:
    assert response.status_code == 400, response.text
    message = response.json()["error"]
    for word in words:
        assert word in message, message
    return message


def _reference(server) -> list[float]:
    r = _post(server, _json(*_good()))
    assert r.status_code == 200, r.text
    return r.json()["outputs"][0]["data"]


def test_zero_dim_tensors_and_scalars_are_400_and_counted(server):
    zero_d = _input("DES", "FP32", [], [1.0])
    _expect_400(_post(server, _json(zero_d, _good()[1])), "'DES'", "shape []")
    header = json.dumps({"inputs": [
        {"name": "DES", "datatype": "FP32", "shape": [], "parameters": {"binary_data_size": 4}},
        _good()[1],
    ]}).encode()  # fmt: skip
    r = _post(
        server, header + b"\0\0\0\0", headers={"Inference-Header-Content-Length": str(len(header))}
    )
    _expect_400(r, "'DES'")
    r = httpx.post(f"http://{server.http_url}/predict",
                   json={"model": "dlrm", "inputs": {"DES": 5, "CATCOLUMN": 3}})  # fmt: skip
    _expect_400(r, "'DES'", "shape []")
    channel, infer = _infer_stub(server)
    with channel:
        request = pb.ModelInferRequest(model_name="dlrm")
        request.inputs.add(name="DES", datatype="FP32", shape=[]).contents.fp32_contents.append(1)
        request.inputs.add(name="CATCOLUMN", datatype="INT64", shape=[1, 8])
        request.inputs[1].contents.int64_contents.extend(CAT[0])
        with pytest.raises(grpc.RpcError) as err:
            infer(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    stats = httpx.get(f"http://{server.http_url}/v2/models/dlrm/stats").json()
    assert stats["model_stats"][0]["inference_stats"]["fail"]["count"] == 4
    assert _reference(server)


def test_datatype_that_is_not_a_string_is_400(server):
    for datatype in (["FP32"], {"a": 1}, 5, None):
        body = _json(_input("DES", datatype, [2, 13], DES), _good()[1])
        _expect_400(_post(server, body), "'DES'", "datatype")


def test_grpc_fp16_typed_contents_is_invalid_argument(server):
    channel, infer = _infer_stub(server)
    with channel:
        request = pb.ModelInferRequest(model_name="dlrm")
        request.inputs.add(name="DES", datatype="FP16", shape=[1, 13])
        request.inputs.add(name="CATCOLUMN", datatype="INT64", shape=[1, 8])
        request.inputs[1].contents.int64_contents.extend(CAT[0])
        with pytest.raises(grpc.RpcError) as err:
            infer(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'DES'" in err.value.details() and "raw_input_contents" in err.value.details()
        # typed integers that do not fit their datatype are refused, not wrapped
        request = pb.ModelInferRequest(model_name="dlrm")
        request.inputs.add(name="DES", datatype="FP32", shape=[1, 13])
        request.inputs[0].contents.fp32_contents.extend(DES[0])
        request.inputs.add(name="CATCOLUMN", datatype="INT64", shape=[1, 8])
        request.inputs[1].contents.int64_contents.extend(CAT[0])
        request.inputs.add(name="ROWINDEX", datatype="INT8", shape=[9])
        request.inputs[2].contents.int_contents.extend([0, 1, 2, 3, 4, 5, 6, 7, 1000])
        with pytest.raises(grpc.RpcError) as err:
            infer(request)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'ROWINDEX'" in err.value.details() and "INT8" in err.value.details()


def test_empty_batch_alone_is_an_empty_result_over_every_route(server):
    r = _post(server, _json(*_good([], [])))
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert out["shape"] == [0, 1] and out["data"] == []
    r = httpx.post(f"http://{server.http_url}/predict",
                   json={"model": "dlrm", "inputs": {"DES": [], "CATCOLUMN": []}})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["outputs"] == {"OUTPUT0": []}
    channel, infer = _infer_stub(server)
    with channel:
        request = pb.ModelInferRequest(model_name="dlrm")
        request.inputs.add(name="DES", datatype="FP32", shape=[0, 13])
        request.inputs.add(name="CATCOLUMN", datatype="INT64", shape=[0, 8])
        response = infer(request)
        assert list(response.outputs[0].shape) == [0, 1]
        assert response.raw_output_contents[0] == b""
    # an empty CSR batch too
    rowindex = _input("ROWINDEX", "INT32", [1], [0])
    r = _post(server, _json(_input("DES", "FP32", [0, 13], []),
                            _input("CATCOLUMN", "INT64", [0], []), rowindex))  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["shape"] == [0, 1]


def test_empty_batch_merged_with_others_gives_the_same_answers(tiny_repository):
    settings = Settings.build(model_repository=tiny_repository(), grpc_port=None,
                              poll_interval_s=0, max_batch_delay_ms=50.0)  # fmt: skip
    app = create_app(settings)
    plane = app.state.plane

    def request(rows: int) -> DecodedRequest:
        des = np.asarray(DES[:rows], np.float32).reshape(rows, 13)
        cat = np.asarray(CAT[:rows], np.int64).reshape(rows, 8)
        declared = {"DES": "FP32", "CATCOLUMN": "INT64"}
        return DecodedRequest({"DES": des, "CATCOLUMN": cat}, declared, None)

    async def main():
        async with app.router.lifespan_context(app):
            alone = await plane.infer("dlrm", "", request(2))
            executions = plane.stats[("dlrm", "1")].execution_count
            merged = await asyncio.gather(
                *(plane.infer("dlrm", "", request(n)) for n in (0, 2, 0, 1))
            )
            return alone, executions, merged, plane.stats[("dlrm", "1")].execution_count

    alone, before, merged, after = asyncio.run(main())
    assert after - before < 4  # some of the four were merged into one execution
    shapes = [r.outputs["OUTPUT0"].shape for r in merged]
    assert shapes == [(0, 1), (2, 1), (0, 1), (1, 1)]
    np.testing.assert_allclose(merged[1].outputs["OUTPUT0"], alone.outputs["OUTPUT0"], atol=1e-6)
    np.testing.assert_allclose(
        merged[3].outputs["OUTPUT0"], alone.outputs["OUTPUT0"][:1], atol=1e-6
    )


@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), float("-inf"), 1e300], ids=["nan", "inf", "-inf", "1e300"]
)
def test_nonfinite_des_is_400_naming_des(server, value):
    des = [[value] + DES[0][1:]]
    body = json.dumps({"inputs": list(_good(des, CAT[:1]))}).encode()  # Python writes NaN
    _expect_400(_post(server, body), "'DES'", "NaN or infinite")
    r = httpx.post(f"http://{server.http_url}/predict",
                   content=json.dumps({"model": "dlrm", "inputs": {"DES": des, "CATCOLUMN": CAT[:1]}}))  # fmt: skip
    _expect_400(r, "'DES'")
    with np.errstate(over="ignore"):
        raw = np.asarray(des, np.float32)
    header = json.dumps({"inputs": [
        {"name": "DES", "datatype": "FP32", "shape": [1, 13], "parameters": {"binary_data_size": 52}},
        _good()[1] | {"shape": [1, 8], "data": CAT[0]},
    ]}).encode()  # fmt: skip
    r = _post(server, header + raw.tobytes(),
              headers={"Inference-Header-Content-Length": str(len(header))})  # fmt: skip
    _expect_400(r, "'DES'")


def test_nonfinite_des_allowed_by_setting_gives_valid_json(tiny_repository):
    srv = _start(tiny_repository(), allow_nonfinite_inputs=True)
    try:
        des = [[float("nan")] + DES[0][1:]]
        r = _post(srv, json.dumps({"inputs": list(_good(des, CAT[:1]))}).encode())
        assert r.status_code == 200, r.text
        json.loads(r.text, parse_constant=lambda c: pytest.fail(f"bare {c} in the response"))
        assert r.json()["outputs"][0]["data"] == [None]  # NaN in, NaN out: null in JSON
        r = httpx.post(f"http://{srv.http_url}/predict",
                       content=json.dumps({"model": "dlrm", "inputs": {"DES": des, "CATCOLUMN": CAT[:1]}}))  # fmt: skip
        assert r.status_code == 200, r.text
        assert r.json()["outputs"]["OUTPUT0"] == [[None]]
    finally:
        srv.stop()


@pytest.mark.parametrize(
    "row",
    [
        [2**63 + i for i in range(8)],  # all >= 2^63: numpy reads uint64, which used to wrap
        [2**63] + CAT[0][1:],
        [2**64] + CAT[0][1:],
        [-(2**63) - 1] + CAT[0][1:],
        [1.5] + CAT[0][1:],
    ],
    ids=["uint64", "2^63", "2^64", "-2^63-1", "fraction"],
)
def test_keys_that_do_not_fit_int64_are_400_naming_catcolumn(server, row):
    _expect_400(_post(server, _json(*_good(DES[:1], [row]))), "'CATCOLUMN'")
    r = httpx.post(f"http://{server.http_url}/predict",
                   json={"model": "dlrm", "inputs": {"DES": DES[:1], "CATCOLUMN": [row]}})  # fmt: skip
    _expect_400(r, "'CATCOLUMN'")


def test_32bit_model_takes_int32_and_fitting_int64_keys(tiny_repository):
    wide = _start(tiny_repository(supportlonglong=True))
    narrow = _start(tiny_repository(supportlonglong=False))
    try:
        expected = _reference(wide)
        meta = httpx.get(f"http://{narrow.http_url}/v2/models/dlrm").json()
        assert {t["name"]: t["datatype"] for t in meta["inputs"]}["CATCOLUMN"] == "INT32"
        for cat_type in ("INT32", "INT64"):
            r = _post(narrow, _json(*_good(cat_type=cat_type)))
            assert r.status_code == 200, (cat_type, r.text)
            np.testing.assert_allclose(r.json()["outputs"][0]["data"], expected, atol=1e-6)
        r = httpx.post(f"http://{narrow.http_url}/predict",
                       json={"model": "dlrm", "inputs": {"DES": DES, "CATCOLUMN": CAT}})  # fmt: skip
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(np.ravel(r.json()["outputs"]["OUTPUT0"]), expected, atol=1e-6)
        channel, infer = _infer_stub(narrow)
        with channel:
            for cat_type, field in (("INT32", "int_contents"), ("INT64", "int64_contents")):
                request = pb.ModelInferRequest(model_name="dlrm")
                request.inputs.add(name="DES", datatype="FP32", shape=[2, 13])
                request.inputs[0].contents.fp32_contents.extend(np.ravel(DES))
                request.inputs.add(name="CATCOLUMN", datatype=cat_type, shape=[2, 8])
                getattr(request.inputs[1].contents, field).extend(np.ravel(CAT).tolist())
                out = np.frombuffer(infer(request).raw_output_contents[0], np.float32)
                np.testing.assert_allclose(out, expected, atol=1e-6)
        # 32-bit keys are HugeCTR's unsigned int (tierserve.ps.keys): an INT64 key up to
        # 2**32-1 is the key whose bits an INT32 tensor carries as a negative number.
        high = [[2**32 - 5] + CAT[0][1:]]
        bits = [[2**32 - 5 - 2**32] + CAT[0][1:]]
        r64 = _post(narrow, _json(*_good(DES[:1], high, "INT64")))
        r32 = _post(narrow, _json(*_good(DES[:1], bits, "INT32")))
        assert r64.status_code == 200 and r32.status_code == 200, (r64.text, r32.text)
        assert r64.json()["outputs"][0]["data"] == r32.json()["outputs"][0]["data"]
        for key, cat_type in ((2**31, "INT32"), (-1, "INT64"), (2**32, "INT64"), (2**40, "INT64")):
            cat = [[key] + CAT[0][1:]]
            _expect_400(_post(narrow, _json(*_good(DES[:1], cat, cat_type))), "'CATCOLUMN'")
    finally:
        wide.stop()
        narrow.stop()


def _csr_body(rows: int, keys_in_first_row: int) -> tuple[bytes, dict]:
    """A binary CSR request: row 0's first slot holds ``keys_in_first_row`` keys."""
    nnz = keys_in_first_row + rows * 8 - 1
    rowindex = np.concatenate([[0], keys_in_first_row + np.arange(rows * 8, dtype=np.int64)])
    arrays = [
        ("DES", "FP32", np.full((rows, 13), 0.1, np.float32)),
        ("CATCOLUMN", "INT64", np.arange(nnz, dtype=np.int64) % 5000),
        ("ROWINDEX", "INT32", rowindex.astype(np.int32)),
    ]
    header = json.dumps({"inputs": [
        {"name": n, "datatype": d, "shape": list(a.shape), "parameters": {"binary_data_size": a.nbytes}}
        for n, d, a in arrays
    ]}).encode()  # fmt: skip
    body = header + b"".join(a.tobytes() for _, _, a in arrays)
    return body, {"Inference-Header-Content-Length": str(len(header))}


def test_keys_over_the_limits_are_refused_before_any_work(tiny_repository):
    srv = _start(tiny_repository(), max_request_bytes=80 * 1024 * 1024)
    try:
        body, headers = _csr_body(2, 1)  # one key per slot: the model's hotness
        assert _post(srv, body, headers=headers).status_code == 200
        body, headers = _csr_body(2, 9)  # 16 keys in row 0 of a table of 8 slots x 1 key
        _expect_400(_post(srv, body, headers=headers), "max_keys_per_row", "16")
        # the request: 8,000,000 keys (64 MB) in one row
        body, headers = _csr_body(1, 8_000_000)
        started = time.perf_counter()
        r = _post(srv, body, headers=headers)
        elapsed = time.perf_counter() - started
        _expect_400(r, "max_keys_per_request", "8000007")
        # The same 64 MB refused for its first input's datatype: the cost of carrying the body
        # alone, measured beside it so that a loaded machine slows both (the limit used to be
        # checked after decoding every key and looking them up: 6 s, ~20x the carrying cost).
        carried = body.replace(b'"FP32"', b'"BF16"', 1)
        started = time.perf_counter()
        _expect_400(_post(srv, carried, headers=headers), "DES")
        carrying = time.perf_counter() - started
        assert elapsed < 4 * carrying + 0.5, (elapsed, carrying)
        assert _reference(srv)
    finally:
        srv.stop()
    srv = _start(tiny_repository(), max_keys_per_request=10, max_keys_per_row=8)
    try:
        _expect_400(_post(srv, _json(*_good())), "max_keys_per_request", "16 keys", "limit of 10")
        body, headers = _csr_body(1, 2)  # 9 keys: under 10, but 9 in row 0 of table 0
        _expect_400(_post(srv, body, headers=headers), "max_keys_per_row", "limit of 8")
        body, headers = _csr_body(1, 1)
        assert _post(srv, body, headers=headers).status_code == 200
    finally:
        srv.stop()


def _embedding_store(repo, tiny_dlrm):
    """``repo`` plus ``emb``: the DLRM's table served as an embedding-lookup model."""
    sparse = tiny_dlrm.sparse_files[0]
    shutil.copytree(sparse, repo / "emb" / "1" / sparse.name)
    config = json.loads((repo / "ps.json").read_text())
    entry = dict(config["models"][0], model="emb", network_file="", dense_file="",
                 sparse_files=[sparse.name], default_value_for_each_table=[0.5])  # fmt: skip
    config["models"].append(entry)
    (repo / "ps.json").write_text(json.dumps(config))
    return repo


def _lookup(server, keys, datatype="INT64", counts=None):
    counts = [len(keys)] if counts is None else counts
    body = _json(_input("KEYS", datatype, [len(keys)], keys),
                 _input("NUMKEYS", "INT32", [len(counts)], counts))  # fmt: skip
    return _post(server, body, path="/v2/models/emb/infer")


def test_embedding_store_keys_width_and_limit(tiny_repository, tiny_dlrm):
    from tierserve.ps.sparse_file import read_sparse_model

    table = read_sparse_model(tiny_dlrm.sparse_files[0], 16)
    keys = np.asarray(table.keys[:5]).tolist() + [4999]
    wide = _start(_embedding_store(tiny_repository(), tiny_dlrm))
    narrow = _start(_embedding_store(tiny_repository(supportlonglong=False), tiny_dlrm))
    try:
        r = _lookup(wide, keys)
        assert r.status_code == 200, r.text
        expected = r.json()["outputs"][0]["data"]
        np.testing.assert_allclose(np.reshape(expected, (6, 16))[:5], table.embeddings[:5])
        for datatype in ("INT32", "INT64"):
            r = _lookup(narrow, keys, datatype)
            assert r.status_code == 200, (datatype, r.text)
            assert r.json()["outputs"][0]["data"] == expected
        assert _lookup(narrow, [2**31] + keys[1:], "INT64").status_code == 200  # unsigned 32 bits
        for key, datatype in ((2**31, "INT32"), (-1, "INT64"), (2**32, "INT64")):
            _expect_400(_lookup(narrow, [key] + keys[1:], datatype), "'KEYS'")
        assert _lookup(wide, [], counts=[0]).json()["outputs"][0]["shape"] == [0]
        # the model's own key limit: max_batch_size 64 x 8 keys per sample
        assert _lookup(wide, list(range(512))).status_code == 200
        _expect_400(_lookup(wide, list(range(513))), "'KEYS'", "513", "max_keys_per_request")
    finally:
        wide.stop()
        narrow.stop()
    srv = _start(_embedding_store(tiny_repository(), tiny_dlrm), max_keys_per_request=1000)
    try:
        assert _lookup(srv, list(range(1000))).status_code == 200
        _expect_400(_lookup(srv, list(range(1001))), "limit of 1000")
    finally:
        srv.stop()
