"""``POST /v2/models/{m}[/versions/{v}]/infer``: the one implementation of REST infer.

:class:`InferEndpoint` is a plain ASGI app: the router mounts it, :class:`InferFastPath` (in
front of FastAPI) calls it directly, leaving out FastAPI's per-request layers, and the native
HTTP transport calls :meth:`InferEndpoint.refuse` and :meth:`InferEndpoint.answer` without
ASGI.  Bodies are JSON tensors or Triton's binary tensor extension
(``Inference-Header-Content-Length``), gzip or deflate.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable

from fastapi import FastAPI

from tierserve.core.errors import TierserveError

from ..errors import http_status
from ..runtime.admission import Admission, ServerBusyError
from ..runtime.dataplane import DataPlane
from ..runtime.policy import error_body, model_name
from ..runtime.tensors import decode_rest_request, encode_rest_response
from .body import (
    BINARY,
    INTERNAL_ERROR,
    JSON,
    check_declared,
    decode_body,
    error_bytes,
    parse_header_length,
    receive_body,
    send_response,
)

log = logging.getLogger("tierserve.server")


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


_INFER_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")


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
                check_declared(length, self.limit)
                body = await receive_body(receive, self.limit)
                if body is None:
                    status = "499"  # the client went away (nginx's code for it)
                    return
                body = decode_body(body, encoding or "", self.limit)
                # the next message is the client's leaving: a request whose client left
                # before its batch ran is dropped
                left = asyncio.ensure_future(receive())
                try:
                    payload, json_length = await _infer_response(
                        plane, model, version, body, parse_header_length(header_length),
                        lambda: not left.done(),
                    )  # fmt: skip
                finally:
                    left.cancel()
            except TierserveError as exc:
                status = str(http_status(exc))
                await send_response(send, http_status(exc), error_bytes(error_body(exc)), JSON)
                return
            except Exception:
                status = "500"
                log.exception("infer request to model %r failed", model[:120])
                await send_response(send, 500, error_bytes(INTERNAL_ERROR), JSON)
                return
            media = JSON if json_length is None else BINARY
            await send_response(send, 200, payload, media, json_length)
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
            check_declared(length, self.limit)
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
            reply(200, payload, JSON if json_length is None else BINARY, json_length)

        try:
            body = decode_body(body, encoding or "", self.limit)
            decoded = decode_rest_request(body, parse_header_length(header_length))
            plane.start_infer(model_name(model), version, decoded, done, alive)
        except Exception as exc:
            self.fail(model, exc, started, reply)

    def fail(self, model: str, exc: BaseException, started: float, reply: Reply) -> None:
        """Answer ``exc`` as :meth:`handle` does: a TierserveError's status and JSON error
        body, anything else a logged 500."""
        if isinstance(exc, TierserveError):
            status = http_status(exc)
            payload = error_bytes(error_body(exc))
        else:
            status, payload = 500, error_bytes(INTERNAL_ERROR)
            log.error("infer request to model %r failed", model[:120], exc_info=exc)
        self.observe(model, started, str(status))
        reply(status, payload, JSON, None)

    def observe(self, model: str, started: float, status: str | None) -> None:
        """Record one infer request's metrics (``status``: None when it succeeded)."""
        plane = self.plane
        plane.metrics.observe_request(
            plane.metrics_label(model), "http", time.perf_counter() - started, status
        )


#: ``reply(status, payload, content_type, json_header_length)``: how :meth:`InferEndpoint.answer`
#: hands its response to the HTTP protocol.
Reply = Callable[[int, bytes, bytes, "int | None"], None]


class InferFastPath:
    """An ASGI app in front of the FastAPI app that :func:`~tierserve.server.app.create_app`
    made: hands ``POST .../infer`` straight to the app's :class:`InferEndpoint`; everything
    else, lifespan included, goes to ``app``.

    A request with a body first takes its room in the worker's budget (the app's
    :class:`~tierserve.server.runtime.admission.Admission`), waiting for it with the body
    unread; one that finds none within ``admission_timeout_s`` is answered 503.  Requests without a body (health,
    metadata, metrics) never wait."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.state = app.state
        self.endpoint: InferEndpoint = app.state.infer_endpoint
        self.admission: Admission = app.state.admission

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
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
            await send_response(send, http_status(exc), error_bytes(error_body(exc)), JSON)
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
