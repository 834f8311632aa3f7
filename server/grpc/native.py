"""The KServe v2 gRPC front end over tierserve's native transport (``server/native``).

HTTP/2 and gRPC framing run in Rust threads; every call reaches this module on the event
loop, in batches: the transport queues calls and wakes the loop through an eventfd, and
:meth:`NativeGrpcServer._drain` takes all of them at once.  The RPCs are answered by the
same code as the ``grpc.aio`` front end (:mod:`.aio`): ``ModelInfer`` through
:meth:`DataPlane.start_infer` without a coroutine, the others through
:class:`~.aio.InferenceServicer`.  What a grpc.aio call costs in Python (its call
objects, coroutines and completion queue, 0.2-0.3 ms of CPU) is gone; what is left is
decoding, the data plane and encoding.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from tierserve.core.errors import ConfigError, InvalidInputError, TierserveError

from ..runtime.admission import make_budget, max_descriptor
from ..runtime.dataplane import DataPlane
from ..runtime.policy import model_name
from ..settings import Settings
from .aio import (
    _METHODS,
    InferenceServicer,
    decode_infer_request,
    encode_infer_response_bytes,
    status_of,
)
from .gen import grpc_predict_v2_pb2 as pb

log = logging.getLogger("tierserve.server")

_OK = 0
#: The most calls, and bytes of their messages, one step of the event loop takes from the
#: transport (the first call is always taken): about 10 ms of decoding at batch 1024.
DRAIN_CALLS = 64
DRAIN_BYTES = 4 << 20


def native_available() -> bool:
    """Whether the native transport (the ``tierserve-native`` package) is installed."""
    try:
        import tierserve_native  # noqa: F401
    except ImportError:
        return False
    return True


def check_native_transport() -> None:
    """:class:`ConfigError` naming ``grpc_transport`` unless the native transport is
    installed."""
    _transport_class()


def _transport_class():
    try:
        from tierserve_native import GrpcTransport
    except ImportError as exc:
        raise ConfigError(
            "grpc_transport 'native' needs the tierserve-native package (Rust sources in "
            "server/native; `make setup` builds it, or `pip install ./server/native` with "
            "cargo on PATH); use grpc_transport 'python' (--grpc-transport python) without it"
        ) from exc
    return GrpcTransport


class _Metadata:
    """The part of a grpc.aio ``ServicerContext`` the servicer reads: the call's metadata."""

    def __init__(self, authorization: str | None) -> None:
        self._metadata = (("authorization", authorization),) if authorization else ()

    def invocation_metadata(self) -> tuple:
        return self._metadata


def _invalid(method: str) -> InvalidInputError:
    return InvalidInputError(f"the {method} request is not a valid {method}Request message")


class NativeGrpcServer:
    """``inference.GRPCInferenceService`` on ``host:port`` over the native transport; the
    same lifecycle as a ``grpc.aio`` server (``start``, ``stop(grace)``)."""

    def __init__(
        self,
        plane: DataPlane,
        host: str,
        port: int,
        admin_token: str | None = None,
        max_message_bytes: int = 64 * 1024 * 1024,
        reuse_port: bool = False,
        threads: int = 1,
        *,
        budget: Any = None,
        settings: Settings | None = None,
        runtime: Any = None,
    ) -> None:
        self.plane = plane
        self.servicer = InferenceServicer(plane, admin_token)
        settings = settings or Settings(max_request_bytes=max_message_bytes)
        if budget is None:
            budget = make_budget(settings, native=True)
        self.budget = budget
        self.transport = _transport_class()(
            host, port, budget=budget, reuse_port=reuse_port, max_message_bytes=max_message_bytes,
            max_connection_bytes=settings.max_connection_bytes,
            max_header_bytes=settings.max_header_bytes,
            header_timeout_s=settings.header_timeout_s, body_timeout_s=settings.body_timeout_s,
            idle_timeout_s=settings.grpc_idle_timeout_s,
            admission_timeout_s=settings.admission_timeout_s,
            max_connections=settings.max_connections,
            max_descriptor=max_descriptor(settings.descriptor_reserve), threads=threads,
            runtime=runtime,
        )  # fmt: skip
        self.port: int = self.transport.port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        self._more: asyncio.Handle | None = None

    async def start(self) -> None:
        """Answer calls on the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.transport.fd, self._drain)

    async def stop(self, grace: float | None = None) -> None:
        """Refuse new connections and ask open ones to go (GOAWAY); answer the calls in
        flight, and those the clients had sent before the GOAWAY, for up to ``grace``
        seconds, until every connection has gone; then close (calls still unanswered get
        UNAVAILABLE)."""
        transport = self.transport
        transport.begin_shutdown()
        deadline = time.monotonic() + (grace or 0.0)
        # no call in flight is not enough: a call may still be on its way in (read by the
        # transport once the client has seen the GOAWAY), until its connection has gone
        while (transport.in_flight or transport.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self._loop is not None:
            self._loop.remove_reader(self.transport.fd)
        if self._more is not None:
            self._more.cancel()
        self.transport.close()

    # -- calls -------------------------------------------------------------------------------

    def _drain(self) -> None:
        """Answer the queued calls, at most :data:`DRAIN_CALLS` calls or
        :data:`DRAIN_BYTES` bytes of messages per loop step: a burst is taken in slices, with
        the loop's other work (health, HTTP) between them."""
        self._more = None
        transport = self.transport
        for call_id, method, message, authorization in transport.take(DRAIN_CALLS, DRAIN_BYTES):
            if method == "ModelInfer":
                self._infer(call_id, message)
            elif method in _METHODS:
                task = asyncio.ensure_future(self._call(call_id, method, message, authorization))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            else:
                transport.reply(
                    call_id,
                    grpc.StatusCode.UNIMPLEMENTED.value[0],
                    f"unknown method {method[:80]!r}",
                    b"",
                )
        if transport.queued and self._loop is not None:
            self._more = self._loop.call_soon(self._drain)

    def _fail(self, call_id: int, exc: BaseException, method: str) -> str:
        if not isinstance(exc, TierserveError):
            log.error("gRPC %s failed", method, exc_info=exc)
        code, message = status_of(exc)
        self.transport.reply(call_id, code.value[0], message, b"")
        return code.name

    def _infer(self, call_id: int, message: bytes) -> None:
        plane = self.plane
        started = time.perf_counter()
        model = ""

        def finish(status: str | None) -> None:
            label = plane.metrics_label(model)
            plane.metrics.observe_request(label, "grpc", time.perf_counter() - started, status)

        def done(result: Any, exc: BaseException | None) -> None:
            if exc is None:
                try:
                    payload = encode_infer_response_bytes(result)
                except Exception as error:
                    exc = error
                else:
                    self.transport.reply(call_id, _OK, "", payload)
                    finish(None)
                    return
            finish(self._fail(call_id, exc, "ModelInfer"))

        try:
            try:
                request = pb.ModelInferRequest.FromString(message)
            except DecodeError as exc:
                raise _invalid("ModelInfer") from exc
            model = request.model_name
            decoded = decode_infer_request(request)
            plane.start_infer(
                model_name(model), request.model_version, decoded, done,
                partial(self.transport.pending, call_id),  # false once the client gave up
            )  # fmt: skip
        except Exception as exc:
            finish(self._fail(call_id, exc, "ModelInfer"))

    async def _call(
        self, call_id: int, method: str, message: bytes, authorization: str | None
    ) -> None:
        request_type, _ = _METHODS[method]
        try:
            try:
                request = request_type.FromString(message)
            except DecodeError as exc:
                raise _invalid(method) from exc
            response = await getattr(self.servicer, method)(request, _Metadata(authorization))
        except Exception as exc:
            self._fail(call_id, exc, method)
            return
        self.transport.reply(call_id, _OK, "", response.SerializeToString())
