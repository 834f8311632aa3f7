"""HTTP on uvicorn (``http_transport`` python): plain uvicorn, its public options, and a small
ASGI middleware for the limits those lack.

uvicorn serves HTTP/1.1 with h11, whose ``h11_max_incomplete_event_size`` bounds a request
head as it arrives (``max_header_bytes``: over it uvicorn answers 400 and closes);
``limit_concurrency`` answers 503 to requests beyond ``max_connections`` connections or
requests; ``timeout_keep_alive`` closes idle connections.  :class:`HttpLimits` refuses a
URL over ``max_header_bytes`` (414) and more than ``max_header_count`` header lines (431),
and closes a request whose body is not in within ``body_timeout_s``.  Requests with a body
take their room in the worker's budget (:class:`~.infer.InferFastPath`).  Not held here: the
header timeout, the descriptor reserve, and exact head bytes (h11 counts what it buffered);
docs/operations.md lists them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from fastapi import FastAPI

from ..settings import Settings, event_loop
from .body import error_bytes as _error_bytes
from .body import send_response as _send
from .infer import InferFastPath

_JSON = b"application/json"


class _BodyTimeout(BaseException):
    """The body did not arrive in time (a BaseException: the app's handlers of Exception
    let it through to :class:`HttpLimits`)."""


class HttpLimits:
    """ASGI middleware: URL and header-count limits, and the body timeout (see the module
    docstring)."""

    def __init__(self, app: Any, settings: Settings) -> None:
        self.app = app
        self.max_header_bytes = settings.max_header_bytes
        self.max_header_count = settings.max_header_count
        self.body_timeout = settings.body_timeout_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        target = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 1
        if target > self.max_header_bytes:
            message = f"the request URL exceed max_header_bytes ({self.max_header_bytes})"
            await _send(send, 414, _error_bytes({"error": message}), _JSON)
            return
        if len(scope["headers"]) > self.max_header_count:
            message = f"the header lines exceed max_header_count ({self.max_header_count})"
            await _send(send, 431, _error_bytes({"error": message}), _JSON)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_timeout
        started = False

        async def timed_receive():
            try:
                return await asyncio.wait_for(receive(), max(deadline - loop.time(), 0.0))
            except TimeoutError:
                raise _BodyTimeout from None

        async def tracked_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, timed_receive, tracked_send)
        except _BodyTimeout:
            if started:
                raise
            message = f"the request body did not arrive within body_timeout_s ({self.body_timeout:g} s)"
            body = _error_bytes({"error": message})
            headers = [(b"content-length", str(len(body)).encode()), (b"content-type", _JSON),
                       (b"connection", b"close")]  # fmt: skip
            await send({"type": "http.response.start", "status": 408, "headers": headers})
            await send({"type": "http.response.body", "body": body})


def uvicorn_config(app: FastAPI, settings: Settings, log_level: str, **extra) -> uvicorn.Config:
    """How plain uvicorn serves ``app`` within ``settings``' limits (module docstring), on
    the event loop gRPC shares (:func:`~tierserve.server.settings.event_loop`)."""
    return uvicorn.Config(
        HttpLimits(InferFastPath(app), settings),
        host=settings.host,
        port=settings.http_port,
        log_level=log_level,
        log_config=None,  # uvicorn's lines in the server's one format (server/logs.py)
        lifespan="on",
        access_log=False,
        proxy_headers=False,  # nothing reads the client address: no X-Forwarded-For parsing
        timeout_graceful_shutdown=settings.shutdown_grace_s,
        timeout_keep_alive=settings.keep_alive_timeout_s,
        limit_concurrency=settings.max_connections,
        http="h11",
        h11_max_incomplete_event_size=settings.max_header_bytes,
        loop=event_loop(settings),
        **extra,
    )
