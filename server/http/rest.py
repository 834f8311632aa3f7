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

Infer has one implementation, :class:`~.infer.InferEndpoint`, a plain ASGI app: the router
mounts it, and :class:`~.infer.InferFastPath` (in front of FastAPI) calls it directly, leaving
out FastAPI's per-request layers.  The other routes live in :mod:`.routes`, by what they
serve.  One exception handler turns every :class:`TierserveError` into its
:func:`~tierserve.server.errors.http_status` with the body ``{"error": message}`` (file paths
cut); anything else is a 500 with ``{"error": "internal error"}`` and a logged traceback.
:mod:`.openapi` documents every route, infer included.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.routing import Route

from tierserve.core.errors import TierserveError

from ..errors import http_status
from ..runtime.dataplane import DataPlane
from ..runtime.policy import AdminToken, error_body
from . import openapi as docs
from .body import INTERNAL_ERROR
from .body import error_bytes as _error_bytes
from .infer import InferEndpoint, InferFastPath, Reply
from .routes.health import add_health_routes, add_metrics_route
from .routes.models import add_model_routes
from .routes.predict import add_predict_route
from .routes.repository import add_repository_routes

#: names importers of this module use (their home is :mod:`.infer` and :mod:`.body`)
__all__ = [
    "INTERNAL_ERROR",
    "InferEndpoint",
    "InferFastPath",
    "Reply",
    "_error_bytes",
    "build_router",
    "install_error_handler",
]

log = logging.getLogger("tierserve.server")


def build_router(
    plane: DataPlane, admin_token: str | None, max_request_bytes: int
) -> tuple[APIRouter, InferEndpoint]:
    """The v2 routes, ``/predict`` and ``/metrics`` over ``plane``, and the infer endpoint
    they mount.  Routes are matched in the order they are added."""
    router = APIRouter()
    endpoint = InferEndpoint(plane, max_request_bytes)
    # The infer route first (it is the hot one).
    for path in docs.INFER_PATHS:
        router.routes.append(Route(path, endpoint, methods=["POST"], include_in_schema=False))
    add_health_routes(router, plane)
    add_model_routes(router, plane)
    add_repository_routes(router, plane, AdminToken(admin_token), max_request_bytes)
    add_predict_route(router, plane, max_request_bytes)
    add_metrics_route(router, plane.metrics)
    return router, endpoint


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
