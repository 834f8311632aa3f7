"""Server-wide routes: ``GET /v2/health/live``, ``/v2/health/ready``, ``/v2`` and
``/metrics`` (Prometheus)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from ...runtime.dataplane import DataPlane
from ...runtime.metrics import ServerMetrics
from .. import openapi as docs

_EMPTY = {"content": {}}


def add_health_routes(router: APIRouter, plane: DataPlane) -> None:
    """Liveness, readiness (the reason in the body when not ready) and server metadata."""

    @router.get(
        "/v2/health/live",
        response_class=Response,
        responses={
            200: {"description": "live", **_EMPTY},
            503: {"description": "not live", **_EMPTY},
        },
    )
    async def live() -> Response:
        """Whether the server answers (KServe v2 liveness); no body."""
        return Response(status_code=200 if plane.live() else 503)

    @router.get(
        "/v2/health/ready",
        response_class=Response,
        responses={
            200: {"description": "every model serves", **_EMPTY},
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


def add_metrics_route(router: APIRouter, metrics: ServerMetrics) -> None:
    """``GET /metrics``: the server's metrics in Prometheus text format."""

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
