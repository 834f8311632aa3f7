"""``POST /predict`` for curl users: ``{"model": m, "version"?: v, "inputs": {"DES": [[...]],
"CATCOLUMN": [[...]]}}`` -> ``{"model": m, "version": v, "outputs": {"OUTPUT0": [[...]]}}``;
inputs take the datatypes the model declares for them."""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from tierserve.core.errors import InvalidInputError, TierserveError

from ...errors import http_status
from ...runtime.dataplane import DataPlane
from ...runtime.policy import model_name
from ...runtime.tensors import (
    DecodedRequest,
    TensorSpec,
    array_from_json,
    dump_json,
    json_values,
    parse_json,
    parse_json_exact,
)
from .. import openapi as docs
from ..body import read_body


def add_predict_route(router: APIRouter, plane: DataPlane, max_request_bytes: int) -> None:
    """``POST /predict``, counted in the metrics under protocol ``http_predict``."""
    metrics = plane.metrics

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
            body = await read_body(request, max_request_bytes)
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
