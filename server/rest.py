"""The KServe v2 REST front end (FastAPI): routes that convert HTTP to data-plane calls.

Routes (``{v}`` segments are optional):

- ``GET /v2/health/live``, ``GET /v2/health/ready``, ``GET /v2``;
- ``GET /v2/models/{m}[/versions/{v}]``, ``.../ready``, ``.../config``, ``.../stats``,
  ``GET /v2/models/stats``;
- ``POST /v2/models/{m}[/versions/{v}]/infer``: JSON tensors or Triton's binary tensor
  extension (``Inference-Header-Content-Length``), gzip or deflate bodies;
- ``POST /v2/repository/index``, ``POST /v2/repository/models/{m}/load`` and ``/unload``
  (bearer token when one is configured);
- ``POST /predict``: ``{"model": m, "inputs": {"DES": [[...]], "CATCOLUMN": [[...]]}}`` ->
  ``{"model": m, "version": v, "outputs": {"OUTPUT0": [[...]]}}`` for curl users;
- ``GET /metrics``: Prometheus.

One exception handler turns every :class:`TierserveError` into its ``http_status`` with the
body ``{"error": message}``.
"""

from __future__ import annotations

import hmac
import json
import re
import time
import zlib
from typing import Any

import numpy as np
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from tierserve.ps.errors import (
    InvalidInputError,
    NotFoundError,
    PayloadTooLargeError,
    TierserveError,
    UnauthorizedError,
)
from tierserve.ps.table_tag import check_name

from .dataplane import DataPlane
from .tensors import DATATYPES, DecodedRequest, decode_rest_request, encode_rest_response

HEADER_LENGTH = "Inference-Header-Content-Length"


def _name(model: str) -> str:
    try:
        return check_name(model, "model name")
    except InvalidInputError as exc:
        # A name that cannot exist is an unknown model, as Triton answers.
        raise NotFoundError(exc.message) from None


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    _check_declared(declared, limit)
    body = await _receive_body(request.receive, limit)
    if body is None:
        raise ClientDisconnect()
    return _decode_body(body, request.headers.get("content-encoding", ""), limit)


def _check_declared(declared: str | None, limit: int) -> None:
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"the request body has {declared} bytes; the limit is {limit}")


def _decode_body(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` after its Content-Encoding (gzip, deflate or none)."""
    encoding = encoding.lower()
    if encoding in ("gzip", "deflate"):
        try:
            decomp = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
            body = decomp.decompress(body, limit + 1)
        except zlib.error as exc:
            raise InvalidInputError(f"the {encoding} body cannot be decompressed: {exc}") from None
        if len(body) > limit or decomp.unconsumed_tail:
            raise PayloadTooLargeError(f"the decompressed body exceeds the limit of {limit} bytes")
    elif encoding not in ("", "identity"):
        raise InvalidInputError(f"unsupported Content-Encoding {encoding!r}")
    return body


def _header_length(request: Request) -> int | None:
    return _parse_header_length(request.headers.get(HEADER_LENGTH))


def _parse_header_length(value: str | None) -> int | None:
    if value is None:
        return None
    if not value.strip().isdigit():
        raise InvalidInputError(f"{HEADER_LENGTH} must be a non-negative integer, got {value!r}")
    return int(value)


async def _infer_response(
    plane: DataPlane, model: str, version: str, body: bytes, header_length: int | None
) -> tuple[bytes, int | None]:
    """Decode, infer and encode one REST infer request: the body and its JSON header length
    (None: the whole body is JSON).  Raises TierserveError for bad requests."""
    decoded = decode_rest_request(body, header_length)
    result = await plane.infer(_name(model), version, decoded)
    return encode_rest_response(
        result.model_name, result.model_version, result.id, result.outputs, result.binary
    )


def build_router(plane: DataPlane, admin_token: str | None, max_request_bytes: int) -> APIRouter:
    """The v2 routes, ``/predict`` and ``/metrics`` over ``plane``."""
    router = APIRouter()
    metrics = plane.metrics

    def authorize(request: Request) -> None:
        if admin_token is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip(), admin_token):
            raise UnauthorizedError(
                "repository load and unload need 'Authorization: Bearer <token>'"
            )

    # The infer route first (routes are matched in order, and it is the hot one), as a plain
    # Starlette route: it needs none of FastAPI's per-request parameter resolution.
    async def infer(request: Request) -> Response:
        started = time.perf_counter()
        status = None
        model = request.path_params["model"]
        version = request.path_params.get("version", "")
        try:
            _name(model)
            body = await _read_body(request, max_request_bytes)
            payload, header_length = await _infer_response(
                plane, model, version, body, _header_length(request)
            )
            headers = {HEADER_LENGTH: str(header_length)} if header_length is not None else {}
            media = "application/octet-stream" if header_length is not None else "application/json"
            return Response(payload, headers=headers, media_type=media)
        except TierserveError as exc:
            status = str(exc.http_status)
            raise
        finally:
            label = plane.metrics_label(model)
            metrics.observe_request(label, "http", time.perf_counter() - started, status)

    for path in ("/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer"):
        router.add_route(path, infer, methods=["POST"], include_in_schema=False)

    @router.get("/v2/health/live")
    async def live() -> Response:
        return Response(status_code=200 if plane.live() else 503)

    @router.get("/v2/health/ready")
    async def ready() -> Response:
        return Response(status_code=200 if plane.ready() else 503)

    @router.get("/v2")
    async def server_metadata() -> dict[str, Any]:
        return plane.server_metadata()

    @router.get("/v2/models/stats")
    async def all_stats() -> dict[str, Any]:
        return plane.model_statistics()

    @router.get("/v2/models/{model}")
    @router.get("/v2/models/{model}/versions/{version}")
    async def model_metadata(model: str, version: str = "") -> dict[str, Any]:
        return plane.model_metadata(_name(model), version)

    @router.get("/v2/models/{model}/ready")
    @router.get("/v2/models/{model}/versions/{version}/ready")
    async def model_ready(model: str, version: str = "") -> Response:
        plane.model_ready(_name(model), version)
        return Response(status_code=200)

    @router.get("/v2/models/{model}/config")
    @router.get("/v2/models/{model}/versions/{version}/config")
    async def model_config(model: str, version: str = "") -> dict[str, Any]:
        return plane.model_config(_name(model), version)

    @router.get("/v2/models/{model}/stats")
    @router.get("/v2/models/{model}/versions/{version}/stats")
    async def model_stats(model: str, version: str = "") -> dict[str, Any]:
        return plane.model_statistics(_name(model), version)

    @router.post("/v2/repository/index")
    async def repository_index(request: Request) -> JSONResponse:
        body = await _read_body(request, max_request_bytes)
        ready = False
        if body.strip():
            try:
                data = json.loads(body)
            except json.JSONDecodeError as exc:
                raise InvalidInputError(f"the request body is not valid JSON: {exc}") from None
            ready = bool(data.get("ready", False)) if isinstance(data, dict) else False
        return JSONResponse(plane.repository_index(ready))

    @router.post("/v2/repository/models/{model}/load")
    async def repository_load(model: str, request: Request) -> Response:
        authorize(request)
        await plane.load(check_name(model, "model name"))
        return Response(status_code=200)

    @router.post("/v2/repository/models/{model}/unload")
    async def repository_unload(model: str, request: Request) -> Response:
        authorize(request)
        await plane.unload(check_name(model, "model name"))
        return Response(status_code=200)

    @router.post("/predict")
    async def predict(request: Request) -> dict[str, Any]:
        """Plain JSON: ``{"model", "version"?, "inputs": {name: nested list}}``."""
        started = time.perf_counter()
        status, label = None, "unknown"
        try:
            body = await _read_body(request, max_request_bytes)
            data, name, version = _plain_json(body)
            label = name
            meta = plane.model_metadata(name, version)
            decoded = _plain_request(data, {t["name"]: t["datatype"] for t in meta["inputs"]})
            result = await plane.infer(name, version, decoded)
            return {
                "model": result.model_name,
                "version": result.model_version,
                "outputs": {k: v.tolist() for k, v in result.outputs.items()},
            }
        except TierserveError as exc:
            status = str(exc.http_status)
            raise
        finally:
            label = plane.metrics_label(label)
            metrics.observe_request(label, "http_predict", time.perf_counter() - started, status)

    @router.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return router


def _plain_json(body: bytes) -> tuple[dict[str, Any], str, str]:
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("inputs"), dict):
        raise InvalidInputError('expected {"model": name, "inputs": {input name: list}}')
    if not isinstance(data.get("model"), str):
        raise InvalidInputError("'model' must name the model")
    return data, _name(data["model"]), str(data.get("version", "") or "")


def _plain_request(data: dict[str, Any], datatypes: dict[str, str]) -> DecodedRequest:
    """Nested lists as arrays of the datatypes the model declares for them."""
    inputs, declared = {}, {}
    for key, value in data["inputs"].items():
        if key not in datatypes:
            raise InvalidInputError(
                f"unexpected input {key!r}; the model's inputs are {sorted(datatypes)}"
            )
        datatype = datatypes[key]
        try:
            array = np.asarray(value)
        except (ValueError, TypeError):
            raise InvalidInputError(f"input {key!r} is a ragged or mixed list") from None
        if array.size and (
            array.dtype.kind not in "iuf" or (datatype != "FP32" and array.dtype.kind == "f")
        ):
            raise InvalidInputError(f"input {key!r} must hold {datatype} numbers")
        inputs[key] = array.astype(DATATYPES[datatype])
        declared[key] = datatype
    return DecodedRequest(inputs=inputs, declared=declared, outputs=None)


def install_error_handler(app: FastAPI) -> None:
    """The one mapping of :class:`TierserveError` to HTTP."""

    @app.exception_handler(TierserveError)
    async def _tierserve_error(request: Request, exc: TierserveError) -> JSONResponse:
        return JSONResponse(exc.to_dict(), status_code=exc.http_status)


# --- the infer fast path ------------------------------------------------------------------

_INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")
_JSON = b"application/json"
_BINARY = b"application/octet-stream"


class InferFastPath:
    """An ASGI app in front of the FastAPI app that answers ``POST .../infer`` itself.

    The route's work is the same as the FastAPI route's (:func:`_infer_response`, the same
    errors and metrics); only FastAPI and Starlette's per-request layers (middleware stack,
    routing, Request and Response objects), about a third of a small request's server time,
    are left out.  Everything else, lifespan included, goes to ``app``.
    """

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.state = app.state
        self.plane: DataPlane = app.state.plane
        self.limit: int = app.state.settings.max_request_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            match = _INFER_PATH.match(scope["path"])
            if match is not None:
                await self._infer(match.group(1), match.group(2) or "", scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _infer(self, model: str, version: str, scope, receive, send) -> None:
        started = time.perf_counter()
        status = None
        plane = self.plane
        try:
            length = encoding = header_length = None
            for key, value in scope["headers"]:
                if key == b"content-length":
                    length = value.decode("latin-1")
                elif key == b"inference-header-content-length":
                    header_length = value.decode("latin-1")
                elif key == b"content-encoding":
                    encoding = value.decode("latin-1")
            try:
                _name(model)
                _check_declared(length, self.limit)
                body = await _receive_body(receive, self.limit)
                if body is None:
                    status = "499"  # the client went away (nginx's code for it)
                    return
                body = _decode_body(body, encoding or "", self.limit)
                payload, json_length = await _infer_response(
                    plane, model, version, body, _parse_header_length(header_length)
                )
            except TierserveError as exc:
                status = str(exc.http_status)
                await _send(send, exc.http_status, _error_body(exc), _JSON)
                return
            await _send(send, 200, payload, _JSON if json_length is None else _BINARY, json_length)
        finally:
            label = plane.metrics_label(model)
            plane.metrics.observe_request(label, "http", time.perf_counter() - started, status)


def _error_body(exc: TierserveError) -> bytes:
    """The error body as the FastAPI exception handler's JSONResponse renders it."""
    return json.dumps(exc.to_dict(), ensure_ascii=False, separators=(",", ":")).encode()


async def _receive_body(receive, limit: int) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None  # http.disconnect
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise PayloadTooLargeError(f"the request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    if len(chunks) == 1:
        return chunks[0]
    return b"".join(chunks)


async def _send(send, status: int, payload: bytes, media: bytes, json_length=None) -> None:
    headers = [(b"content-length", str(len(payload)).encode()), (b"content-type", media)]
    if json_length is not None:
        headers.append((b"inference-header-content-length", str(json_length).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})
