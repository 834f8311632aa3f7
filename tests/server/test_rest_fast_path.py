"""The REST infer fast path (``InferFastPath``) answers exactly as the FastAPI route does.

Both are driven in-process (httpx over ASGI) on one app with a small predictor; every request
goes to the app with and without the fast path in front, and status, headers that matter and
body must agree: good JSON and binary requests, the versioned path, gzip, and the 4xx cases.
"""

from __future__ import annotations

import asyncio
import gzip
import json

import httpx
import numpy as np
import pytest
from doubler_model import binary_body, doubler_loader, write_doubler_repository

from tierserve.server.app import create_app
from tierserve.server.http.rest import InferFastPath
from tierserve.server.settings import Settings


@pytest.fixture
def repo(tmp_path):
    return write_doubler_repository(tmp_path)


def _requests():
    des = np.arange(6, dtype=np.float32).reshape(2, 3)
    cat = np.array([[1, 2], [3, 4]], dtype=np.int64)
    json_body = json.dumps({
        "id": "r1",
        "inputs": [
            {"name": "DES", "datatype": "FP32", "shape": [2, 3], "data": des.ravel().tolist()},
            {"name": "CATCOLUMN", "datatype": "INT64", "shape": [2, 2], "data": cat.tolist()},
        ],
    }).encode()  # fmt: skip
    binary, header_length = binary_body(des, cat)
    hl = {"Inference-Header-Content-Length": str(header_length)}
    return {
        "json": ("/v2/models/m/infer", json_body, {}),
        "versioned": ("/v2/models/m/versions/1/infer", json_body, {}),
        "binary": ("/v2/models/m/infer", binary, hl),
        "gzip": ("/v2/models/m/infer", gzip.compress(json_body), {"Content-Encoding": "gzip"}),
        "unknown model": ("/v2/models/nope/infer", json_body, {}),
        "bad name": ("/v2/models/a%20b/infer", json_body, {}),
        "unknown version": ("/v2/models/m/versions/7/infer", json_body, {}),
        "bad json": ("/v2/models/m/infer", b'{"inputs": [', {}),
        "bad header length": ("/v2/models/m/infer", binary, {**hl, HEADER: "x"}),
        "header length past body": ("/v2/models/m/infer", binary, {HEADER: "100000"}),
        "truncated": ("/v2/models/m/infer", binary[:-3], hl),
        "bad encoding": ("/v2/models/m/infer", json_body, {"Content-Encoding": "br"}),
        "bad gzip": ("/v2/models/m/infer", b"not gzip", {"Content-Encoding": "gzip"}),
        "too large": ("/v2/models/m/infer", b"x" * 5000, {}),
        "wrong shape": ("/v2/models/m/infer", json_body.replace(b"[2, 2]", b"[1, 4]"), {}),
    }


HEADER = "Inference-Header-Content-Length"


async def _post(app, path: str, body: bytes, headers: dict) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        return await client.post(path, content=body, headers=headers)


def test_fast_path_answers_as_the_route(repo):
    settings = Settings.build(
        model_repository=repo, grpc_port=None, poll_interval_s=0, max_request_bytes=4096
    )
    app = create_app(settings, loader=doubler_loader)
    fast = InferFastPath(app)

    async def main():
        async with app.router.lifespan_context(app):
            out = {}
            for name, (path, body, headers) in _requests().items():
                out[name] = (
                    await _post(app, path, body, headers),
                    await _post(fast, path, body, headers),
                )
            # not the infer route: passed through to FastAPI
            ready = await httpx.AsyncClient(
                transport=httpx.ASGITransport(app=fast), base_url="http://test"
            ).get("/v2/health/ready")
            return out, ready

    out, ready = asyncio.run(main())
    assert ready.status_code == 200
    for name, (route, quick) in out.items():
        assert quick.status_code == route.status_code, (name, route.text, quick.text)
        assert quick.content == route.content, name
        assert quick.headers.get(HEADER) == route.headers.get(HEADER), name
        ctype = quick.headers["content-type"].split(";")[0]
        assert ctype == route.headers["content-type"].split(";")[0], name
    assert out["json"][1].json()["outputs"][0]["data"] == [9.0, 31.0]
    assert out["json"][1].json()["id"] == "r1"
    raw = out["binary"][1]
    start = int(raw.headers[HEADER])
    assert np.frombuffer(raw.content[start:], np.float32).tolist() == [9.0, 31.0]
    expected = {
        "unknown model": 404, "bad name": 404, "unknown version": 404, "bad json": 400,
        "bad header length": 400, "header length past body": 400, "truncated": 400,
        "bad encoding": 400, "bad gzip": 400, "too large": 413, "wrong shape": 400,
    }  # fmt: skip
    for name, status in expected.items():
        assert out[name][1].status_code == status, (name, out[name][1].text)
        assert out[name][1].json()["error"], name


def test_client_gone_before_the_body_arrives(repo):
    settings = Settings.build(model_repository=repo, grpc_port=None, poll_interval_s=0)
    app = create_app(settings, loader=doubler_loader)
    fast = InferFastPath(app)
    sent = []

    async def receive():
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v2/models/m/infer", "headers": []}

    async def main():
        async with app.router.lifespan_context(app):
            await fast(scope, receive, send)

    asyncio.run(main())
    assert sent == []  # nothing is written to a closed connection
    assert b'status="499"' in app.state.plane.metrics.render()
