"""Fuzzing the front ends: schemathesis against the OpenAPI document of a live server, and
Hypothesis against the REST (JSON and binary tensor) and gRPC request decoders.

Every check schemathesis has runs; the only failures allowed are none.  After the fuzzing the
server still answers a known request with the model's answer.  The suite runs a bounded
number of examples (``TIERSERVE_FUZZ_EXAMPLES``, default 8 per operation); ``make fuzz``
runs many more.
"""

from __future__ import annotations

import json
import os

import grpc
import httpx
import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import CHECKS, load_all_checks
from schemathesis.generation.modes import GenerationMode

from tierserve.core.errors import InvalidInputError
from tierserve.server.app import BackgroundServer
from tierserve.server.grpc.aio import decode_infer_request
from tierserve.server.grpc.gen import grpc_predict_v2_pb2 as pb
from tierserve.server.runtime.tensors import DATATYPES, decode_rest_request
from tierserve.server.settings import Settings

EXAMPLES = int(os.environ.get("TIERSERVE_FUZZ_EXAMPLES", "8"))
TOKEN = "fuzz-token"
DES = [[0.1 * i for i in range(13)]]
CAT = [[1, 1001, 1502, 3502, 3801, 3851, 4651, 4751]]
GOOD = {
    "inputs": [
        {"name": "DES", "datatype": "FP32", "shape": [1, 13], "data": DES},
        {"name": "CATCOLUMN", "datatype": "INT64", "shape": [1, 8], "data": CAT},
    ]
}


@pytest.fixture(scope="module")
def live(tiny_repository):
    settings_ = Settings.build(
        model_repository=tiny_repository(), http_port=0, grpc_port=0, poll_interval_s=0,
        admin_token=TOKEN, max_request_bytes=1 << 20,
    )  # fmt: skip
    with BackgroundServer(settings_) as server:
        good = httpx.post(f"http://{server.http_url}/v2/models/dlrm/infer", json=GOOD)
        assert good.status_code == 200, good.text
        server.expected = good.json()["outputs"][0]["data"]
        yield server
        # after everything the fuzzers sent: the known request, the known answer
        again = httpx.post(f"http://{server.http_url}/v2/models/dlrm/infer", json=GOOD)
        assert again.status_code == 200, again.text
        assert again.json()["outputs"][0]["data"] == server.expected


load_all_checks()
ALL_CHECKS = list(CHECKS.get_all())


def test_openapi_routes_with_every_check(live):
    """schemathesis's ``--checks all``, schema-valid and schema-violating requests to every
    operation (driven here rather than by its pytest plugin, which pytest 9 breaks)."""
    api = schemathesis.openapi.from_url(f"http://{live.http_url}/openapi.json")
    failures = []
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 19
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=os.environ.get("TIERSERVE_FUZZ_RANDOM") is None,
                database=None,
            )
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case):
                case.call_and_validate(checks=ALL_CHECKS, timeout=30)

            try:
                run()
            except Unsatisfiable:
                assert mode == GenerationMode.NEGATIVE  # nothing in it can be made invalid
            except Exception as exc:  # noqa: BLE001 - collected, reported together below
                failures.append(f"{operation.label} ({mode}): {exc}")
    assert not failures, "\n\n".join(failures)


def test_openapi_documents_every_route(live):
    doc = httpx.get(f"http://{live.http_url}/openapi.json").json()
    paths = doc["paths"]
    infer = paths["/v2/models/{model}/infer"]["post"]
    assert {"200", "400", "404", "413"} <= set(infer["responses"])
    body = infer["requestBody"]["content"]
    assert body["application/json"]["schema"] == {"$ref": "#/components/schemas/InferRequest"}
    assert "InferResponse" in doc["components"]["schemas"]
    assert "/v2/models/{model}/versions/{version}/infer" in paths
    assert "401" in paths["/v2/repository/models/{model}/load"]["post"]["responses"]
    live_route = paths["/v2/health/live"]["get"]["responses"]["200"]
    assert not live_route.get("content")  # an empty body is not JSON
    served = set(_route_paths(live.app.routes))
    assert "/v2/models/{model}/infer" in served and "/predict" in served
    assert served - {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"} <= set(paths)


def _route_paths(routes):
    for route in routes:
        included = getattr(route, "original_router", None)  # FastAPI's included routers
        if included is not None:
            yield from _route_paths(included.routes)
        elif hasattr(route, "path"):
            yield route.path


# --- the decoders ----------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=12,
)
shapes = st.one_of(st.lists(st.integers(-2, 4), max_size=4), json_values)
datatypes = st.one_of(st.sampled_from([*DATATYPES, "BYTES", "fp32", ""]), json_values)


@st.composite
def rest_bodies(draw):
    """A REST infer body: JSON (often close to valid) and sometimes binary tensors after it."""
    inputs = []
    for i in range(draw(st.integers(0, 3))):
        tensor = {
            "name": draw(st.sampled_from(["DES", "CATCOLUMN", "ROWINDEX", f"x{i}"]) | json_values),
            "datatype": draw(datatypes),
            "shape": draw(shapes),
        }
        if draw(st.booleans()):
            tensor["parameters"] = {"binary_data_size": draw(st.integers(-1, 64) | json_values)}
        else:
            tensor["data"] = draw(json_values)
        inputs.append(tensor)
    request = {"inputs": inputs if draw(st.booleans()) else draw(json_values)}
    for key in ("id", "parameters", "outputs"):
        if draw(st.booleans()):
            request[key] = draw(json_values)
    header = json.dumps(request).encode()
    if draw(st.booleans()):
        header = draw(st.binary(max_size=64)) if draw(st.booleans()) else header[: len(header) // 2]
    binary = draw(st.binary(max_size=96))
    length = draw(st.none() | st.just(len(header)) | st.integers(-4, len(header) + 8))
    return header + (binary if length is not None else b""), length


@settings(max_examples=max(EXAMPLES * 40, 200), deadline=None)
@given(rest_bodies())
def test_rest_decoder_raises_only_invalid_input(body_and_length):
    body, length = body_and_length
    try:
        decoded = decode_rest_request(body, length)
    except InvalidInputError:
        return
    for name, array in decoded.inputs.items():
        assert isinstance(name, str) and isinstance(array, np.ndarray)
        assert decoded.declared[name] in DATATYPES


@st.composite
def grpc_requests(draw):
    request = pb.ModelInferRequest(model_name=draw(st.text(max_size=8)))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        tensor = request.inputs.add(
            name=draw(st.sampled_from(["DES", "CATCOLUMN", "ROWINDEX"]) | st.text(max_size=4)),
            datatype=draw(st.sampled_from([*DATATYPES, "BYTES", ""])),
            shape=draw(st.lists(st.integers(-2, 5), max_size=3)),
        )
        if raw:
            request.raw_input_contents.append(draw(st.binary(max_size=48)))
        else:
            contents = tensor.contents
            contents.int_contents.extend(
                draw(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=6))
            )
            contents.int64_contents.extend(
                draw(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6))
            )
            contents.uint_contents.extend(draw(st.lists(st.integers(0, 2**32 - 1), max_size=6)))
            contents.fp32_contents.extend(draw(st.lists(st.floats(width=32), max_size=6)))
            contents.fp64_contents.extend(draw(st.lists(st.floats(), max_size=6)))
            contents.bool_contents.extend(draw(st.lists(st.booleans(), max_size=6)))
    if raw and draw(st.booleans()):
        request.raw_input_contents.append(b"extra")
    for _ in range(draw(st.integers(0, 2))):
        request.outputs.add(name=draw(st.text(max_size=6)))
    return request


@settings(max_examples=max(EXAMPLES * 40, 200), deadline=None)
@given(grpc_requests())
def test_grpc_decoder_raises_only_invalid_input(request):
    try:
        decoded = decode_infer_request(request)
    except InvalidInputError:
        return
    for name, array in decoded.inputs.items():
        assert isinstance(array, np.ndarray) and decoded.declared[name] in DATATYPES


@settings(
    max_examples=max(EXAMPLES * 5, 40), deadline=None, suppress_health_check=list(HealthCheck)
)
@given(rest_bodies())
def test_live_rest_infer_never_answers_5xx(live, body_and_length):
    body, length = body_and_length
    headers = (
        {} if length is None or length < 0 else {"Inference-Header-Content-Length": str(length)}
    )
    r = httpx.post(f"http://{live.http_url}/v2/models/dlrm/infer", content=body, headers=headers)
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        assert r.headers["content-type"] == "application/json" and r.json()["error"]


@settings(
    max_examples=max(EXAMPLES * 5, 40), deadline=None, suppress_health_check=list(HealthCheck)
)
@given(grpc_requests())
def test_live_grpc_infer_never_answers_internal(live, request):
    request.model_name = "dlrm"
    with grpc.insecure_channel(live.grpc_url) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=pb.ModelInferRequest.SerializeToString,
            response_deserializer=pb.ModelInferResponse.FromString,
        )
        try:
            call(request, timeout=30)
        except grpc.RpcError as exc:
            assert exc.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND), (
                exc.code(),
                exc.details(),
            )
