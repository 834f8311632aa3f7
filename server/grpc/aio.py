"""The KServe v2 gRPC front end: ``inference.GRPCInferenceService`` on ``grpc.aio``.

The servicer only converts protobuf messages to data-plane calls and back; it runs on the
same event loop as the REST front end, so both feed the same dynamic batchers.  One wrapper
around every handler maps every :class:`TierserveError` to
``grpc.StatusCode[grpc_status(error)]`` (:mod:`tierserve.server.errors`).

The messages come from ``server/grpc/proto/grpc_predict_v2.proto`` (Triton's field numbers, in
package ``tierserve.v2`` so they coexist with tritonclient's generated ``inference.*``
modules in one process); the handlers are registered under Triton's service name, which is
all a client sees.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format

from tierserve.core.errors import InvalidInputError, TierserveError

from ..errors import grpc_status
from ..runtime.admission import Admission, max_descriptor, open_descriptors
from ..runtime.dataplane import DataPlane
from ..runtime.policy import (
    AdminToken,
    load_name,
    model_name,
    public_index,
    public_message,
    repository_parameters,
)
from ..runtime.tensors import (
    DATATYPES,
    DecodedRequest,
    RequestedOutput,
    array_from_bytes,
    check_int_range,
    datatype_of,
    element_count,
    shape_text,
)
from ..settings import Settings
from .gen import grpc_predict_v2_pb2 as pb

SERVICE = "inference.GRPCInferenceService"
log = logging.getLogger("tierserve.server")

#: Which InferTensorContents field carries each datatype.
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def _param_value(p: Any) -> Any:
    which = p.WhichOneof("parameter_choice")
    return getattr(p, which) if which else None


def _typed_contents(name: str, datatype: str, shape: tuple[int, ...], contents) -> np.ndarray:
    """An input given in ``InferTensorContents``: its datatype's field, range-checked."""
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidInputError(
            f"input {name!r}: {datatype} has no typed contents field; send it in raw_input_contents"
        )
    dims, count = element_count(name, shape)
    values = getattr(contents, field)
    if len(values) != count:
        raise InvalidInputError(
            f"input {name!r}: contents hold {len(values)} values; shape {shape_text(dims)} "
            f"needs {count}"
        )
    wide = np.asarray(values)  # int32/int64/uint32/uint64/float/double/bool as protobuf holds them
    dtype = DATATYPES[datatype]
    if wide.dtype.kind in "iu" and dtype.kind in "iu":
        check_int_range(name, wide, dtype)
    with np.errstate(over="ignore"):  # FP64 -> FP32 overflow is infinite: check_finite says so
        return wide.astype(dtype, copy=False).reshape(dims)


def decode_infer_request(request: pb.ModelInferRequest) -> DecodedRequest:
    """A ``ModelInferRequest`` as numpy arrays (raw contents or typed contents)."""
    if not request.inputs:
        raise InvalidInputError("the request needs at least one input")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInputError(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; "
            "give every input in raw form or none"
        )
    inputs: dict[str, np.ndarray] = {}
    declared: dict[str, str] = {}
    for i, tensor in enumerate(request.inputs):
        name, datatype, shape = tensor.name, tensor.datatype, tuple(tensor.shape)
        if name in inputs:
            raise InvalidInputError(f"input {name!r} is given twice")
        if datatype not in DATATYPES:
            raise InvalidInputError(
                f"input {name!r}: datatype {datatype[:40]!r} is not supported; "
                f"use one of {sorted(DATATYPES)}"
            )
        if raw:
            array = array_from_bytes(name, datatype, shape, raw[i])
        else:
            array = _typed_contents(name, datatype, shape, tensor.contents)
        inputs[name] = array
        declared[name] = datatype
    outputs = [RequestedOutput(o.name, True) for o in request.outputs] or None
    return DecodedRequest(
        inputs=inputs,
        declared=declared,
        outputs=outputs,
        id=request.id,
        parameters={k: _param_value(v) for k, v in request.parameters.items()}
        if request.parameters
        else {},
        binary_output=True,
    )


def encode_infer_response(result) -> pb.ModelInferResponse:
    """Outputs as ``raw_output_contents`` (what tritonclient reads first)."""
    response = pb.ModelInferResponse(
        model_name=result.model_name, model_version=result.model_version, id=result.id
    )
    for name, array in result.outputs.items():
        array = np.ascontiguousarray(array)
        response.outputs.add(name=name, datatype=datatype_of(array), shape=list(array.shape))
        response.raw_output_contents.append(array.astype(array.dtype.newbyteorder("<")).tobytes())
    return response


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _bytes_field(tag: int, data: bytes) -> bytes:
    """One length-delimited protobuf field (``tag`` = field number << 3 | 2)."""
    return bytes((tag,)) + _varint(len(data)) + data


#: Most distinct response prefixes remembered (model, version, output names, datatypes
#: and shapes; a model answers a batch size with the same one).
RESPONSE_PREFIXES = 256
_prefixes: dict[tuple, bytes] = {}
_ID, _RAW_OUTPUT = 0x1A, 0x32  # ModelInferResponse.id (3), raw_output_contents (6)


def encode_infer_response_bytes(result) -> bytes:
    """:func:`encode_infer_response` serialized, from a remembered prefix: the model,
    version and output metadata, then ``id`` and the raw outputs (protobuf readers take
    fields in any order, so this parses to the same message)."""
    arrays = [(name, np.ascontiguousarray(array)) for name, array in result.outputs.items()]
    key = (
        result.model_name,
        result.model_version,
        tuple((name, array.dtype.str, array.shape) for name, array in arrays),
    )
    prefix = _prefixes.get(key)
    if prefix is None:
        head = pb.ModelInferResponse(
            model_name=result.model_name, model_version=result.model_version
        )
        for name, array in arrays:
            head.outputs.add(name=name, datatype=datatype_of(array), shape=list(array.shape))
        prefix = head.SerializeToString()
        if len(_prefixes) >= RESPONSE_PREFIXES:
            _prefixes.clear()
        _prefixes[key] = prefix
    parts = [prefix]
    if result.id:
        parts.append(_bytes_field(_ID, result.id.encode()))
    for _, array in arrays:
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        parts.append(_bytes_field(_RAW_OUTPUT, array.tobytes()))
    return b"".join(parts)


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The gRPC status and message a call that raised ``exc`` is answered with: a
    :class:`TierserveError`'s own, anything else INTERNAL (the one mapping of both front
    ends)."""
    if isinstance(exc, TierserveError):
        return grpc.StatusCode[grpc_status(exc)], public_message(exc)
    return grpc.StatusCode.INTERNAL, "internal error"


def _mapping_errors(method):
    """``method`` with the one mapping of :class:`TierserveError` to a gRPC status.

    A wrapper at registration rather than a server interceptor: grpc.aio runs an interceptor
    chain (and its extra coroutines) for every RPC once any interceptor is installed."""

    async def behavior(request, context):
        try:
            return await method(request, context)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            if not isinstance(exc, TierserveError):
                log.exception("gRPC %s failed", method.__name__)
            await context.abort(*status_of(exc))

    return behavior


class InferenceServicer:
    """The RPCs of ``inference.GRPCInferenceService`` over a :class:`DataPlane`."""

    def __init__(
        self, plane: DataPlane, admin_token: str | None = None, admission: Admission | None = None
    ) -> None:
        self.plane = plane
        self.token = AdminToken(admin_token)
        #: grpc.aio's ModelInfer takes its room here (the native transport takes it itself)
        self.admission = admission

    def _authorize(self, context) -> None:
        given = dict(context.invocation_metadata() or ()).get("authorization")
        self.token.check(given, where="metadata")

    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=self.plane.live())

    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=self.plane.ready())

    async def ModelReady(self, request, context):
        try:
            ready = self.plane.model_ready(model_name(request.name), request.version)
        except TierserveError:
            ready = False
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request, context):
        return json_format.ParseDict(self.plane.server_metadata(), pb.ServerMetadataResponse())

    async def ModelMetadata(self, request, context):
        meta = self.plane.model_metadata(model_name(request.name), request.version)
        return json_format.ParseDict(meta, pb.ModelMetadataResponse())

    async def ModelConfig(self, request, context):
        config = self.plane.model_config(model_name(request.name), request.version)
        return pb.ModelConfigResponse(config=json_format.ParseDict(config, pb.ModelConfig()))

    async def ModelStatistics(self, request, context):
        name = model_name(request.name) if request.name else ""
        stats = self.plane.model_statistics(name, request.version)
        return json_format.ParseDict(stats, pb.ModelStatisticsResponse())

    async def RepositoryIndex(self, request, context):
        index = public_index(self.plane.repository_index(request.ready))
        return json_format.ParseDict({"models": index}, pb.RepositoryIndexResponse())

    async def RepositoryModelLoad(self, request, context):
        self._authorize(context)
        repository_parameters("load", dict(request.parameters))
        await self.plane.load(load_name(request.model_name))
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request, context):
        self._authorize(context)
        repository_parameters("unload", dict(request.parameters))
        await self.plane.unload(load_name(request.model_name))
        return pb.RepositoryModelUnloadResponse()

    async def ModelInfer(self, request, context):
        started = time.perf_counter()
        status = None
        size, held = request.ByteSize(), False
        try:
            if self.admission is not None:
                await self.admission.take(1, size)
                held = True
            decoded = decode_infer_request(request)
            result = await self.plane.infer(
                model_name(request.model_name), request.model_version, decoded
            )
            return encode_infer_response_bytes(result)
        except Exception as exc:
            status = status_of(exc)[0].name
            raise
        except asyncio.CancelledError:  # the client gave up (deadline, cancel, hang-up)
            status = grpc.StatusCode.CANCELLED.name
            raise
        finally:
            if held:
                self.admission.give(1, size)
            label = self.plane.metrics_label(request.model_name)
            self.plane.metrics.observe_request(label, "grpc", time.perf_counter() - started, status)


_METHODS = {
    "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse),
    "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse),
    "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse),
    "ServerMetadata": (pb.ServerMetadataRequest, pb.ServerMetadataResponse),
    "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse),
    "ModelInfer": (pb.ModelInferRequest, pb.ModelInferResponse),
    "ModelConfig": (pb.ModelConfigRequest, pb.ModelConfigResponse),
    "ModelStatistics": (pb.ModelStatisticsRequest, pb.ModelStatisticsResponse),
    "RepositoryIndex": (pb.RepositoryIndexRequest, pb.RepositoryIndexResponse),
    "RepositoryModelLoad": (pb.RepositoryModelLoadRequest, pb.RepositoryModelLoadResponse),
    "RepositoryModelUnload": (pb.RepositoryModelUnloadRequest, pb.RepositoryModelUnloadResponse),
}


def service_handler(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
    """The method handlers of ``inference.GRPCInferenceService`` bound to ``servicer``."""
    handlers = {
        method: grpc.unary_unary_rpc_method_handler(
            _mapping_errors(getattr(servicer, method)),
            request_deserializer=req.FromString,
            # ModelInfer answers serialized bytes (encode_infer_response_bytes)
            response_serializer=None if method == "ModelInfer" else resp.SerializeToString,
        )
        for method, (req, resp) in _METHODS.items()
    }
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


def create_grpc_server(
    plane: DataPlane,
    address: str,
    admin_token: str | None = None,
    max_message_bytes: int = 64 * 1024 * 1024,
    reuse_port: bool = False,
    settings: Settings | None = None,
    admission: Admission | None = None,
) -> tuple[grpc.aio.Server, int]:
    """An unstarted ``grpc.aio`` server bound to ``address`` (``host:port``), and its port;
    ``reuse_port``: other processes may bind the port too (worker processes).

    grpc's core holds it to ``settings``' limits where it has them: calls in flight
    (``max_inflight_calls``; more are refused with RESOURCE_EXHAUSTED at once), connections
    (``max_connections``, less those the descriptor reserve keeps), the handshake within
    ``header_timeout_s`` and idle connections closed after ``grpc_idle_timeout_s``.  Given
    ``admission``, a ModelInfer call takes its room in the worker's budget once received.
    """
    settings = settings or Settings(max_request_bytes=max_message_bytes)
    # grpc's core counts connections, not descriptors: those open now are left out
    free = max_descriptor(settings.descriptor_reserve) - open_descriptors()
    connections = min(settings.max_connections, free)
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.so_reuseport", 1 if reuse_port else 0),
        ("grpc.max_metadata_size", settings.max_header_bytes),
        ("grpc.max_allowed_incoming_connections", max(1, connections)),
        ("grpc.server_handshake_timeout_ms", int(settings.header_timeout_s * 1000)),
        ("grpc.max_connection_idle_ms", int(settings.grpc_idle_timeout_s * 1000)),
    ]
    server = grpc.aio.server(options=options, maximum_concurrent_rpcs=settings.max_inflight_calls)
    servicer = InferenceServicer(plane, admin_token, admission)
    server.add_generic_rpc_handlers((service_handler(servicer),))
    port = server.add_insecure_port(address)
    return server, port
