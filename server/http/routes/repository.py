"""The repository API: ``POST /v2/repository/index`` and
``POST /v2/repository/models/{m}/load`` and ``/unload`` (bearer token when one is
configured)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from tierserve.core.errors import InvalidInputError

from ...runtime.dataplane import DataPlane
from ...runtime.policy import AdminToken, load_name, public_index, repository_parameters
from ...runtime.tensors import parse_json
from .. import openapi as docs
from ..body import read_body

_EMPTY = {"content": {}}


def add_repository_routes(
    router: APIRouter, plane: DataPlane, token: AdminToken, max_request_bytes: int
) -> None:
    """The index (all models, or the ready ones) and load / unload by name."""

    @router.post(
        "/v2/repository/index",
        response_model=list[docs.RepositoryModel],
        responses=docs.BODY_ERRORS,
        openapi_extra=docs.optional_body(docs.RepositoryIndexRequest),
    )
    async def repository_index(request: Request) -> JSONResponse:
        body = await read_body(request, max_request_bytes)
        ready = False
        if body:  # no body: the whole index
            data = parse_json(body)
            if not isinstance(data, dict):
                raise InvalidInputError('the request body must be a JSON object: {"ready": bool}')
            ready = data.get("ready", False)
            if not isinstance(ready, bool):
                raise InvalidInputError("'ready' must be true or false")
        return JSONResponse(public_index(plane.repository_index(ready)))

    admin_responses = {
        200: {"description": "done", **_EMPTY},
        **docs.ADMIN_ERRORS,
    }

    @router.post(
        "/v2/repository/models/{model}/load", response_class=Response, responses=admin_responses
    )
    async def repository_load(model: str, request: Request) -> Response:
        token.check(request.headers.get("authorization"))
        await _repository_body(request, "load", max_request_bytes)
        await plane.load(load_name(model))
        return Response(status_code=200)

    @router.post(
        "/v2/repository/models/{model}/unload", response_class=Response, responses=admin_responses
    )
    async def repository_unload(model: str, request: Request) -> Response:
        token.check(request.headers.get("authorization"))
        await _repository_body(request, "unload", max_request_bytes)
        await plane.unload(load_name(model))
        return Response(status_code=200)


async def _repository_body(request: Request, action: str, limit: int) -> None:
    """Refuse what a load or unload body carries that is not supported (policy)."""
    body = await read_body(request, limit)
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
