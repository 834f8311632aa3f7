"""Per-model routes: ``GET /v2/models/stats`` and ``/v2/models/{m}[/versions/{v}]``
metadata, ``.../ready``, ``.../config`` and ``.../stats``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from ...runtime.dataplane import DataPlane
from ...runtime.policy import model_name
from .. import openapi as docs

_EMPTY = {"content": {}}


def add_model_routes(router: APIRouter, plane: DataPlane) -> None:
    """Metadata, readiness, configuration and statistics of the served models; an unknown
    model or version is answered as the data plane's error says (404)."""

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

    ready_responses = {200: {"description": "the model serves", **_EMPTY}, **docs.MODEL_ERRORS}

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
