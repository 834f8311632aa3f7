"""The REST front end's OpenAPI document: KServe v2 request and response schemas.

Pydantic models describe the bodies; :func:`install` makes the app's ``/openapi.json``
include the infer routes (served by a plain ASGI endpoint, which FastAPI does not document
by itself) and every status and content type the server answers with.  The models only
document: requests are decoded by :mod:`tierserve.server.runtime.tensors`, which accepts what these
schemas allow
and refuses the rest with a 4xx naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict, Field

from ..runtime.tensors import DATATYPES

INFER_PATHS = ("/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer")

Datatype = Literal[tuple(DATATYPES)]  # type: ignore[valid-type]
Dim = Field(ge=0)


class ErrorBody(BaseModel):
    """Every 4xx and 5xx answer: what was wrong, naming the field."""

    error: str


class TensorParameters(BaseModel):
    """Per-tensor parameters of the binary tensor extension."""

    model_config = ConfigDict(extra="allow")
    binary_data_size: int | None = Field(None, ge=0)
    binary_data: bool | None = None


class RequestInput(BaseModel):
    """One input tensor: ``data`` (row-major, flat or nested) or ``binary_data_size`` bytes
    after the JSON header."""

    name: str
    shape: list[int] = Field(max_length=32, json_schema_extra={"items": {"minimum": 0}})
    datatype: Datatype
    parameters: TensorParameters | None = None
    data: list[Any] | None = None


class RequestOutput(BaseModel):
    """An output the caller wants (all of them when ``outputs`` is left out)."""

    name: str
    parameters: TensorParameters | None = None


class InferRequest(BaseModel):
    """KServe v2 infer request (JSON, or the JSON header of a binary request)."""

    id: str | None = None
    parameters: dict[str, Any] | None = None
    inputs: list[RequestInput] = Field(min_length=1)
    outputs: list[RequestOutput] | None = None


class ResponseOutput(BaseModel):
    """One output tensor: ``data`` (flat; ``null`` for NaN or infinite values) or
    ``binary_data_size`` bytes after the JSON header."""

    name: str
    datatype: Datatype
    shape: list[int]
    parameters: TensorParameters | None = None
    data: list[Any] | None = None


class InferResponse(BaseModel):
    """KServe v2 infer response."""

    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[ResponseOutput]


class TensorMetadata(BaseModel):
    name: str
    datatype: Datatype
    shape: list[int]


class ModelMetadata(BaseModel):
    """KServe v2 model metadata."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class ServerMetadata(BaseModel):
    """KServe v2 server metadata."""

    name: str
    version: str
    extensions: list[str]


class ModelStatistics(BaseModel):
    """Triton's statistics extension."""

    model_stats: list[dict[str, Any]]


class RepositoryModel(BaseModel):
    """One model of the repository index."""

    name: str
    version: str
    state: str
    reason: str


class RepositoryIndexRequest(BaseModel):
    ready: bool = False


class PredictRequest(BaseModel):
    """``POST /predict``: inputs by name as nested lists, shaped as the model declares."""

    model: str
    version: str | int | None = None
    inputs: dict[str, Any]


class PredictResponse(BaseModel):
    model: str
    version: str
    outputs: dict[str, list[Any]]


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "model": ErrorBody}


MODEL_ERRORS: dict[int | str, dict[str, Any]] = {
    404: _error("no such model or version"),
    503: _error("the model is not ready (loading, or its last load failed)"),
}
BODY_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("malformed body (not JSON, wrong fields)"),
    413: _error("body over the server's max_request_bytes"),
}
INFER_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error(
        "bad input: wrong names, datatypes or shapes, values out of range, NaN or infinite "
        "floats, over max_batch_size or the key limits, malformed or truncated body"
    ),
    **MODEL_ERRORS,
    413: BODY_ERRORS[413],
    500: _error("an unexpected server fault (logged with its traceback)"),
    507: _error("a storage tier is full"),
}
ADMIN_ERRORS: dict[int | str, dict[str, Any]] = {
    400: _error("the model name is not valid, or the body carries a parameter that is not "
                "supported (load: none; unload: unload_dependents)"),
    401: _error("an admin token is set and the request does not carry it"),
    404: _error("no such model"),
    503: _error("the model failed to load"),
}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def required_body(model: type[BaseModel], binary: bool = False) -> dict[str, Any]:
    """``openapi_extra`` declaring a JSON request body of ``model`` (the route reads it raw)."""
    content: dict[str, Any] = {"application/json": {"schema": _ref(model)}}
    if binary:
        content["application/octet-stream"] = {
            "schema": {"type": "string", "format": "binary"},
        }
    return {"requestBody": {"required": True, "content": content}}


def optional_body(model: type[BaseModel]) -> dict[str, Any]:
    body = required_body(model)
    body["requestBody"]["required"] = False
    return body


#: Models referenced from ``openapi_extra`` and the infer paths, added to the components.
_EXTRA_MODELS = (InferRequest, InferResponse, ErrorBody, RepositoryIndexRequest, PredictRequest)


def _infer_operation(versioned: bool) -> dict[str, Any]:
    params = [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]
    if versioned:
        params.append(
            {"name": "version", "in": "path", "required": True, "schema": {"type": "string"}}
        )
    params += [
        {
            "name": "Inference-Header-Content-Length",
            "in": "header",
            "required": False,
            "description": "binary tensor extension: length of the JSON header of the body",
            "schema": {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
        },
        {
            "name": "Content-Encoding",
            "in": "header",
            "required": False,
            "schema": {"type": "string", "enum": ["gzip", "deflate", "identity"]},
        },
    ]
    responses: dict[str, Any] = {
        "200": {
            "description": "the outputs (JSON; or a JSON header and binary outputs, whose length "
            "the Inference-Header-Content-Length header gives)",
            "content": {
                "application/json": {"schema": _ref(InferResponse)},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            },
        }
    }
    for status, spec in INFER_ERRORS.items():
        responses[str(status)] = {
            "description": spec["description"],
            "content": {"application/json": {"schema": _ref(ErrorBody)}},
        }
    return {
        "summary": "Infer" + (" with a version" if versioned else ""),
        "description": "KServe v2 inference: JSON tensors or Triton's binary tensor extension.",
        "operationId": "infer_versioned" if versioned else "infer",
        "parameters": params,
        "requestBody": required_body(InferRequest, binary=True)["requestBody"],
        "responses": responses,
    }


def install(app: FastAPI) -> None:
    """Make ``app.openapi()`` document the infer routes and the extra body models."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title,
            version=app.version,
            summary=app.summary,
            description=app.description,
            routes=app.routes,
        )
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in _EXTRA_MODELS:
            found = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(found.pop("$defs", {}))
            components[model.__name__] = found
        paths = schema.setdefault("paths", {})
        for path in INFER_PATHS:
            paths[path] = {"post": _infer_operation("{version}" in path)}
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
