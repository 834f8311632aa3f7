"""The repository extension and routes over real HTTP and gRPC: what a load request may carry,
odd version folders, and paths with a trailing slash.

A small real DLRM (tests/server/conftest.py) served by a BackgroundServer on loopback;
requests are raw JSON and protobuf messages, plus tritonclient where it shows what a real
client sends.
"""

from __future__ import annotations

import shutil

import grpc
import httpx
import pytest
import tritonclient.http as th

from tierserve.server.app import BackgroundServer
from tierserve.server.grpc.gen import grpc_predict_v2_pb2 as pb
from tierserve.server.settings import Settings


@pytest.fixture
def served(tiny_repository):
    repo = tiny_repository()
    settings = Settings.build(model_repository=repo, http_port=0, grpc_port=0, poll_interval_s=0)
    with BackgroundServer(settings) as server:
        yield repo, server


def _load_stub(server, method: str = "RepositoryModelLoad"):
    channel = grpc.insecure_channel(server.grpc_url)
    request, response = {
        "RepositoryModelLoad": (pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse),
        "RepositoryModelUnload": (
            pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse
        ),
    }[method]  # fmt: skip
    return channel, channel.unary_unary(
        f"/inference.GRPCInferenceService/{method}",
        request_serializer=request.SerializeToString,
        response_deserializer=response.FromString,
    )


@pytest.mark.parametrize(
    "body, named",
    [
        ({"parameters": {"config": '{"max_batch_size": 8}'}}, "config"),
        ({"parameters": {"file:1/dlrm.json": "e30="}}, "file:1/dlrm.json"),
        ({"parameters": {"anything": 1}}, "anything"),
        ({"parameters": "config"}, "parameters"),
        ({"config": "{}"}, "config"),
        ([1], "JSON object"),
    ],
)
def test_load_parameters_are_refused_naming_them(served, body, named):
    """Load overrides (``config``, ``file:<path>``) are not supported: a 400 naming the
    parameter, and the model serves on as it was, instead of a 200 that changed nothing."""
    _, server = served
    url = f"http://{server.http_url}/v2/repository/models/dlrm/load"
    r = httpx.post(url, json=body)
    assert r.status_code == 400, r.text
    assert named in r.json()["error"]
    assert httpx.post(url).status_code == 200  # no body: a plain load
    assert httpx.post(url, json={}).status_code == 200
    assert httpx.post(url, json={"parameters": {}}).status_code == 200


def test_tritonclient_load_with_a_config_is_refused_and_unload_still_works(served):
    _, server = served
    client = th.InferenceServerClient(server.http_url)
    with pytest.raises(Exception, match="config"):
        client.load_model("dlrm", config='{"max_batch_size": 8}')
    client.load_model("dlrm")
    client.unload_model("dlrm")  # sends parameters.unload_dependents: false
    client.unload_model("dlrm", unload_dependents=True)  # no dependents: the same
    client.load_model("dlrm")
    assert client.is_model_ready("dlrm")


def test_grpc_load_parameters_are_invalid_argument_naming_them(served):
    _, server = served
    channel, load = _load_stub(server)
    try:
        request = pb.RepositoryModelLoadRequest(model_name="dlrm")
        request.parameters["config"].string_param = "{}"
        with pytest.raises(grpc.RpcError) as err:
            load(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "config" in err.value.details()
        load(pb.RepositoryModelLoadRequest(model_name="dlrm"), timeout=30)
    finally:
        channel.close()
    channel, unload = _load_stub(server, "RepositoryModelUnload")
    try:
        request = pb.RepositoryModelUnloadRequest(model_name="dlrm")
        request.parameters["unload_dependents"].bool_param = False
        unload(request, timeout=30)
        request.parameters["force"].bool_param = True
        with pytest.raises(grpc.RpcError) as err:
            unload(request, timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "force" in err.value.details()
    finally:
        channel.close()


@pytest.mark.parametrize("name", ["²", "٣"])
def test_a_folder_named_with_other_digits_leaves_the_load_api_working(served, name):
    """``int('²')`` raised inside the load request: a 500, and polling broke for every model."""
    repo, server = served
    shutil.copytree(repo / "dlrm" / "1", repo / "dlrm" / name)
    url = f"http://{server.http_url}"
    assert httpx.post(f"{url}/v2/repository/models/dlrm/load").status_code == 200
    assert httpx.get(f"{url}/v2/models/dlrm").json()["versions"] == ["1"]
    index = httpx.post(f"{url}/v2/repository/index").json()
    assert [(m["name"], m["version"], m["state"]) for m in index] == [("dlrm", "1", "READY")]


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/v2/models/dlrm/infer/"),
        ("POST", "/v2/models/dlrm/versions/1/infer/"),
        ("GET", "/v2/health/ready/"),
        ("GET", "/v2/models/dlrm/"),
        ("POST", "/v2/repository/models/dlrm/load/"),
    ],
)
def test_a_trailing_slash_is_404_not_a_redirect(served, method, path):
    """A redirect would send a POST body to a second request (and some clients follow 307s
    with the body, some without): the route is answered as written or not at all."""
    _, server = served
    r = httpx.request(method, f"http://{server.http_url}{path}", json={"inputs": []})
    assert r.status_code == 404, (r.status_code, r.headers)
    assert "location" not in r.headers
