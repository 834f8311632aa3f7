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

Infer has one implementation, :class:`InferEndpoint`, a plain ASGI app: the router mounts it,
and :class:`InferFastPath` (in front of FastAPI) calls it directly, leaving out FastAPI's
per-request layers.  One exception handler turns every :class:`TierserveError` into its
:func:`~tierserve.server.errors.http_status` with the body ``{"error": message}`` (file paths cut);
anything else is a
500 with ``{"error": "internal error"}`` and a logged traceback.  :mod:`.openapi` documents
every route, infer included.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import zlib
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect
from starlette.routing import Route

from tierserve.core.errors import InvalidInputError, PayloadTooLargeError, TierserveError

from ..errors import http_status
from ..runtime.admission import Admission, ServerBusyError
from ..runtime.dataplane import DataPlane
from ..runtime.policy import (
    AdminToken,
    error_body,
    load_name,
    model_name,
    public_index,
    repository_parameters,
)
from ..runtime.tensors import (
    DecodedRequest,
    TensorSpec,
    array_from_json,
    decode_rest_request,
    dump_json,
    encode_rest_response,
    json_values,
    parse_json,
    parse_json_exact,
)
from . import openapi as docs

log = logging.getLogger("tierserve.server")

HEADER_LENGTH = "Inference-Header-Content-Length"
_DIGITS = re.compile(r"[0-9]{1,19}")
INTERNAL_ERROR = {"error": "internal error"}


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    _check_declared(declared, limit)
    body = await _receive_body(request.receive, limit)
    if body is None:
        raise ClientDisconnect()
    return _decode_body(body, request.headers.get("content-encoding", ""), limit)


def _check_declared(declared: str | None, limit: int) -> None:
    if declared is None:
        return
    if not _DIGITS.fullmatch(declared) or int(declared) > limit:
        raise PayloadTooLargeError(
            f"the request body has {declared[:20]} bytes; the limit is {limit}"
        )


def _decode_body(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` after its Content-Encoding (gzip, deflate or none)."""
    encoding = encoding.lower().strip()
    if encoding in ("gzip", "deflate"):
        try:
            decomp = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
            body = decomp.decompress(body, limit + 1)
        except zlib.error as exc:
            raise InvalidInputError(f"the {encoding} body cannot be decompressed: {exc}") from None
        if len(body) > limit or decomp.unconsumed_tail:
            raise PayloadTooLargeError(f"the decompressed body exceeds the limit of {limit} bytes")
    elif encoding not in ("", "identity"):
        raise InvalidInputError(f"unsupported Content-Encoding {encoding[:40]!r}")
    return body


def _parse_header_length(value: str | None) -> int | None:
    if value is None:
        return None
    if not _DIGITS.fullmatch(value.strip()):
        raise InvalidInputError(
            f"{HEADER_LENGTH} must be a non-negative integer, got {value[:40]!r}"
        )
    return int(value)


async def _infer_response(
    plane: DataPlane,
    model: str,
    version: str,
    body: bytes,
    header_length: int | None,
    alive: Callable[[], bool] | None = None,
) -> tuple[bytes, int | None]:
    """Decode, infer and encode one REST infer request: the body and its JSON header length
    (None: the whole body is JSON).  Raises TierserveError for bad requests; ``alive()``
    false before its batch runs (the client left) drops it."""
    decoded = decode_rest_request(body, header_length)
    result = await plane.infer(model_name(model), version, decoded, alive)
    return encode_rest_response(
        result.model_name, result.model_version, result.id, result.outputs, result.binary
    )


# --- infer: the one implementation ---------------------------------------------------------

_INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")
_JSON = b"application/json"
_BINARY = b"application/octet-stream"


class InferEndpoint:
    """``POST /v2/models/{m}[/versions/{v}]/infer`` as an ASGI app (see the module docstring).

    Mounted as a route it reads the model and version from ``path_params``; called through
    :meth:`handle` it is given them.
    """

    def __init__(self, plane: DataPlane, limit: int) -> None:
        self.plane = plane
        self.limit = limit

    async def __call__(self, scope, receive, send) -> None:
        params = scope.get("path_params") or {}
        await self.handle(params.get("model", ""), params.get("version", ""), scope, receive, send)

    async def handle(self, model: str, version: str, scope, receive, send) -> None:
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
                # an unknown model is a 404 whatever the request holds
                plane.model_ready(model_name(model), version)
                _check_declared(length, self.limit)
                body = await _receive_body(receive, self.limit)
                if body is None:
                    status = "499"  # the client went away (nginx's code for it)
                    return
                body = _decode_body(body, encoding or "", self.limit)
                # the next message is the client's leaving: a request whose client left
                # before its batch ran is dropped
                left = asyncio.ensure_future(receive())
                try:
                    payload, json_length = await _infer_response(
                        plane, model, version, body, _parse_header_length(header_length),
                        lambda: not left.done(),
                    )  # fmt: skip
                finally:
                    left.cancel()
            except TierserveError as exc:
                status = str(http_status(exc))
                await _send(send, http_status(exc), _error_bytes(error_body(exc)), _JSON)
                return
            except Exception:
                status = "500"
                log.exception("infer request to model %r failed", model[:120])
                await _send(send, 500, _error_bytes(INTERNAL_ERROR), _JSON)
                return
            await _send(send, 200, payload, _JSON if json_length is None else _BINARY, json_length)
        finally:
            label = plane.metrics_label(model)
            plane.metrics.observe_request(label, "http", time.perf_counter() - started, status)

    # -- served by the native HTTP transport (server/http/native.py), without ASGI ---------

    def refuse(self, model: str, version: str, length: str | None) -> TierserveError | None:
        """The error an infer request gets before its body is read (unknown model, declared
        body over the limit), as :meth:`handle` answers it; None when there is none."""
        try:
            if not self.plane.serves(model, version):
                self.plane.model_ready(model_name(model), version)
            _check_declared(length, self.limit)
        except TierserveError as exc:
            return exc
        return None

    def answer(
        self,
        model: str,
        version: str,
        body: bytes,
        encoding: str | None,
        header_length: str | None,
        started: float,
        reply: Reply,
        alive: Callable[[], bool] | None = None,
    ) -> None:
        """Answer one infer request whose body is all in, as :meth:`handle` does:
        ``reply(status, payload, content_type, json_header_length)`` is called once, at
        once for a request that cannot run, else from the event loop when its batch is done
        (``alive()`` false by then, the client gone: it does not run).  The request's metrics
        are recorded.  Never raises."""
        plane = self.plane

        def done(result, exc: BaseException | None) -> None:
            try:
                if exc is None:
                    payload, json_length = encode_rest_response(
                        result.model_name, result.model_version, result.id, result.outputs,
                        result.binary,
                    )  # fmt: skip
            except Exception as error:
                exc = error
            if exc is not None:
                self.fail(model, exc, started, reply)
                return
            self.observe(model, started, None)
            reply(200, payload, _JSON if json_length is None else _BINARY, json_length)

        try:
            body = _decode_body(body, encoding or "", self.limit)
            decoded = decode_rest_request(body, _parse_header_length(header_length))
            plane.start_infer(model_name(model), version, decoded, done, alive)
        except Exception as exc:
            self.fail(model, exc, started, reply)

    def fail(self, model: str, exc: BaseException, started: float, reply: Reply) -> None:
        """Answer ``exc`` as :meth:`handle` does: a TierserveError's status and JSON error
        body, anything else a logged 500."""
        if isinstance(exc, TierserveError):
            status = http_status(exc)
            payload = _error_bytes(error_body(exc))
        else:
            status, payload = 500, _error_bytes(INTERNAL_ERROR)
            log.error("infer request to model %r failed", model[:120], exc_info=exc)
        self.observe(model, started, str(status))
        reply(status, payload, _JSON, None)

    def observe(self, model: str, started: float, status: str | None) -> None:
        """Record one infer request's metrics (``status``: None when it succeeded)."""
        plane = self.plane
        plane.metrics.observe_request(
            plane.metrics_label(model), "http", time.perf_counter() - started, status
        )


#: ``reply(status, payload, content_type, json_header_length)``: how :meth:`InferEndpoint.answer`
#: hands its response to the HTTP protocol.
Reply = Callable[[int, bytes, bytes, "int | None"], None]


def _error_bytes(body: dict[str, str]) -> bytes:
    """An error body as the FastAPI exception handler's JSONResponse renders it."""
    return dump_json(body)


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


class InferFastPath:
    """An ASGI app in front of the FastAPI app that hands ``POST .../infer`` straight to the
    app's :class:`InferEndpoint`; everything else, lifespan included, goes to ``app``.

    A request with a body first takes its room in the worker's budget (the app's
    :class:`~tierserve.server.runtime.admission.Admission`), waiting for it with the body unread;
    one that finds none
    within ``admission_timeout_s`` is answered 503.  Requests without a body (health,
    metadata, metrics) never wait."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.state = app.state
        self.endpoint: InferEndpoint = app.state.infer_endpoint
        self.admission: Admission | None = getattr(app.state, "admission", None)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or self.admission is None:
            await self._serve(scope, receive, send)
            return
        need = _body_room(scope["headers"], self.endpoint.limit, self.admission.undeclared)
        if need is None:
            await self._serve(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            await self.admission.take(1, need)
        except ServerBusyError as exc:
            match = _INFER_PATH.match(scope["path"])
            if match is not None:
                self.endpoint.observe(match.group(1), started, str(http_status(exc)))
            await _send(send, http_status(exc), _error_bytes(error_body(exc)), _JSON)
            return
        try:
            await self._serve(scope, receive, send)
        finally:
            self.admission.give(1, need)

    async def _serve(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            match = _INFER_PATH.match(scope["path"])
            if match is not None:
                model, version = match.group(1), match.group(2) or ""
                await self.endpoint.handle(model, version, scope, receive, send)
                return
        await self.app(scope, receive, send)


def _body_room(headers, limit: int, undeclared: int) -> int | None:
    """The budget bytes a request's body takes: its declared length (0 when over ``limit``:
    it is refused unread), ``undeclared`` for a chunked body; None without a body."""
    for key, value in headers:
        if key == b"content-length":
            if not value.isdigit() or len(value) > 19:
                return 0  # refused by the route, unread
            declared = int(value)
            if declared == 0:
                return None
            return declared if declared <= limit else 0
        if key == b"transfer-encoding":
            return undeclared
    return None


# --- the other routes ------------------------------------------------------------------------


def build_router(
    plane: DataPlane, admin_token: str | None, max_request_bytes: int
) -> tuple[APIRouter, InferEndpoint]:
    """The v2 routes, ``/predict`` and ``/metrics`` over ``plane``, and the infer endpoint
    they mount."""
    router = APIRouter()
    metrics = plane.metrics
    token = AdminToken(admin_token)
    endpoint = InferEndpoint(plane, max_request_bytes)

    # The infer route first (routes are matched in order, and it is the hot one).
    for path in docs.INFER_PATHS:
        router.routes.append(Route(path, endpoint, methods=["POST"], include_in_schema=False))

    empty = {"content": {}}

    @router.get(
        "/v2/health/live",
        response_class=Response,
        responses={
            200: {"description": "live", **empty},
            503: {"description": "not live", **empty},
        },
    )
    async def live() -> Response:
        """Whether the server answers (KServe v2 liveness); no body."""
        return Response(status_code=200 if plane.live() else 503)

    @router.get(
        "/v2/health/ready",
        response_class=Response,
        responses={
            200: {"description": "every model serves", **empty},
            503: {"description": "starting, a model does not serve, or the Kafka updates are "
                   "not read up to where they were at start; the body says which "
                   '(`{"error": "..."}`)'},
        },
    )
    async def ready() -> Response:
        """Whether the server and all its models serve (KServe v2 readiness); no body when
        ready, the reason when not."""
        if plane.ready():
            return Response(status_code=200)
        return JSONResponse({"error": plane.not_ready_reason()}, status_code=503)

    @router.get("/v2", response_model=docs.ServerMetadata)
    async def server_metadata() -> dict[str, Any]:
        return plane.server_metadata()

    @router.get("/v2/models/stats", response_model=docs.ModelStatistics)
    async def all_stats() -> dict[str, Any]:
        return plane.model_statistics()

    @router.get(
        "/v2/models/{model}", response_model=docs.ModelMetadata, responses=docs.MODEL_ERRORS
    )
    @router.get(
        "/v2/models/{model}/versions/{version}",
        response_model=docs.ModelMetadata,
        responses=docs.MODEL_ERRORS,
    )
    async def model_metadata(model: str, version: str = "") -> dict[str, Any]:
        return plane.model_metadata(model_name(model), version)

    ready_responses = {200: {"description": "the model serves", **empty}, **docs.MODEL_ERRORS}

    @router.get("/v2/models/{model}/ready", response_class=Response, responses=ready_responses)
    @router.get(
        "/v2/models/{model}/versions/{version}/ready",
        response_class=Response,
        responses=ready_responses,
    )
    async def model_ready(model: str, version: str = "") -> Response:
        plane.model_ready(model_name(model), version)
        return Response(status_code=200)

    @router.get(
        "/v2/models/{model}/config", response_model=dict[str, Any], responses=docs.MODEL_ERRORS
    )
    @router.get(
        "/v2/models/{model}/versions/{version}/config",
        response_model=dict[str, Any],
        responses=docs.MODEL_ERRORS,
    )
    async def model_config(model: str, version: str = "") -> dict[str, Any]:
        return plane.model_config(model_name(model), version)

    @router.get(
        "/v2/models/{model}/stats", response_model=docs.ModelStatistics, responses=docs.MODEL_ERRORS
    )
    @router.get(
        "/v2/models/{model}/versions/{version}/stats",
        response_model=docs.ModelStatistics,
        responses=docs.MODEL_ERRORS,
    )
    async def model_stats(model: str, version: str = "") -> dict[str, Any]:
        return plane.model_statistics(model_name(model), version)

    @router.post(
        "/v2/repository/index",
        response_model=list[docs.RepositoryModel],
        responses=docs.BODY_ERRORS,
        openapi_extra=docs.optional_body(docs.RepositoryIndexRequest),
    )
    async def repository_index(request: Request) -> JSONResponse:
        body = await _read_body(request, max_request_bytes)
        ready = False
        if body:  # no body: the whole index
            data = parse_json(body)
            if not isinstance(data, dict):
                raise InvalidInputError('the request body must be a JSON object: {"ready": bool}')
            ready = data.get("ready", False)
            if not isinstance(ready, bool):
                raise InvalidInputError("'ready' must be true or false")
        return JSONResponse(public_index(plane.repository_index(ready)))

    async def _repository_body(request: Request, action: str) -> None:
        """Refuse what a load or unload body carries that is not supported (policy)."""
        body = await _read_body(request, max_request_bytes)
        if not body.strip():
            return
        data = parse_json(body)
        if not isinstance(data, dict):
            raise InvalidInputError(
                f'the repository {action} body must be a JSON object: {{"parameters": {{}}}}'
            )
        extra = sorted(set(data) - {"parameters"})
        if extra:
            raise InvalidInputError(
                f"repository {action}: unknown field {', '.join(map(repr, extra))} (the body "
                "takes 'parameters' only)"
            )
        repository_parameters(action, data.get("parameters", {}))

    admin_responses = {
        200: {"description": "done", **empty},
        **docs.ADMIN_ERRORS,
    }

    @router.post(
        "/v2/repository/models/{model}/load", response_class=Response, responses=admin_responses
    )
    async def repository_load(model: str, request: Request) -> Response:
        token.check(request.headers.get("authorization"))
        await _repository_body(request, "load")
        await plane.load(load_name(model))
        return Response(status_code=200)

    @router.post(
        "/v2/repository/models/{model}/unload", response_class=Response, responses=admin_responses
    )
    async def repository_unload(model: str, request: Request) -> Response:
        token.check(request.headers.get("authorization"))
        await _repository_body(request, "unload")
        await plane.unload(load_name(model))
        return Response(status_code=200)

    @router.post(
        "/predict",
        response_model=docs.PredictResponse,
        responses=docs.INFER_ERRORS,
        openapi_extra=docs.required_body(docs.PredictRequest),
    )
    async def predict(request: Request) -> Response:
        """Plain JSON: ``{"model", "version"?, "inputs": {name: nested list}}``."""
        started = time.perf_counter()
        status, label = None, "unknown"
        try:
            body = await _read_body(request, max_request_bytes)
            data, name, version = _plain_json(body)
            label = name
            decoded = _plain_request(data, plane.input_specs(name, version))
            result = await plane.infer(name, version, decoded)
            # encoded here (orjson), not by FastAPI's encoder; the response model documents it
            answer = {
                "model": result.model_name,
                "version": result.model_version,
                "outputs": {k: json_values(v) for k, v in result.outputs.items()},
            }
            return Response(dump_json(answer), media_type="application/json")
        except TierserveError as exc:
            status = str(http_status(exc))
            raise
        finally:
            label = plane.metrics_label(label)
            metrics.observe_request(label, "http_predict", time.perf_counter() - started, status)

    @router.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {
                "description": "Prometheus text exposition format",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        },
    )
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return router, endpoint


def _plain_json(body: bytes) -> tuple[dict[str, Any], str, str]:
    data = parse_json(body)
    if not isinstance(data, dict) or not isinstance(data.get("inputs"), dict):
        raise InvalidInputError('expected {"model": name, "inputs": {input name: list}}')
    if not isinstance(data.get("model"), str):
        raise InvalidInputError("'model' must name the model")
    version = data.get("version", "")
    if isinstance(version, float) and version.is_integer():
        # an integer beyond 64 bits, which orjson reads as a float: read it exactly
        version = parse_json_exact(body).get("version")
    if version is None:
        version = ""
    if not isinstance(version, (str, int)) or isinstance(version, bool):
        raise InvalidInputError("'version' must be a string or an integer")
    return data, model_name(data["model"]), str(version)


def _plain_request(data: dict[str, Any], specs: dict[str, TensorSpec]) -> DecodedRequest:
    """Nested lists as arrays of the datatypes the model declares for them; an empty list is
    an empty batch of the declared row shape."""
    inputs, declared = {}, {}
    for key, value in data["inputs"].items():
        if key not in specs:
            raise InvalidInputError(
                f"unexpected input {key[:120]!r}; the model's inputs are {sorted(specs)}"
            )
        datatype, shape = specs[key].datatype, specs[key].shape
        array = array_from_json(key, datatype, value)
        if array.shape == (0,) and len(shape) > 1 and all(d >= 0 for d in shape[1:]):
            array = array.reshape(0, *shape[1:])
        inputs[key] = array
        declared[key] = datatype
    return DecodedRequest(inputs=inputs, declared=declared, outputs=None)


def install_error_handler(app: FastAPI) -> None:
    """The one mapping of errors to HTTP: :class:`TierserveError` to its status, anything
    else to a 500 that says nothing of the server's insides."""

    @app.exception_handler(TierserveError)
    async def _tierserve_error(request: Request, exc: TierserveError) -> JSONResponse:
        return JSONResponse(error_body(exc), status_code=http_status(exc))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return JSONResponse(INTERNAL_ERROR, status_code=500)
