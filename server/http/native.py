"""The HTTP front end over tierserve's native transport (``server/native``).

HTTP/1.1 runs in Rust threads (hyper's HTTP/1.1 server): connections, request heads and
bodies within the limits, and ``POST /v2/models/{m}[/versions/{v}]/infer`` parsed and
decoded (JSON or Triton's binary tensor extension) into typed buffers.  Requests reach this module on the event loop
in batches (the transport wakes the loop through an eventfd), the decoded infer requests of
one signature merged into one (:meth:`NativeHttpServer._group`): the data plane checks,
batches and runs them as one request, and the transport cuts and encodes each client's
answer.  An infer request the transport did not decode (an unusual or malformed body) is
answered by :class:`~.rest.InferEndpoint`, as on the Python transport, errors and all;
every other route by the FastAPI app, called as an ASGI app.
"""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import Any
from urllib.parse import unquote

import numpy as np
from fastapi import FastAPI

from tierserve.core.errors import ConfigError, PayloadTooLargeError

from ..grpc.native import DRAIN_BYTES, DRAIN_CALLS
from ..runtime.admission import max_descriptor
from ..runtime.dataplane import DataPlane
from ..runtime.policy import model_name
from ..runtime.tensors import (
    DATATYPES,
    DecodedRequest,
    RequestedOutput,
    datatype_of,
    encode_rest_response,
)
from ..settings import Settings
from .rest import INTERNAL_ERROR, InferEndpoint, _error_bytes

log = logging.getLogger("tierserve.server")

_JSON = [(b"content-type", b"application/json")]
_BINARY = b"application/octet-stream"
#: Output datatypes the transport encodes (FP16 is encoded here).
_ENCODED = frozenset(DATATYPES) - {"FP16"}


def _transport_class():
    try:
        from tierserve_native import HttpTransport
    except ImportError as exc:
        raise ConfigError(
            "http_transport 'native' needs the tierserve-native package (Rust sources in "
            "server/native; `make setup` builds it, or `pip install ./server/native` with "
            "cargo on PATH); use http_transport 'python' (--http-transport python) without it"
        ) from exc
    return HttpTransport


def check_native_transport() -> None:
    """:class:`ConfigError` naming ``http_transport`` unless the native transport is
    installed."""
    _transport_class()


class NativeHttpServer:
    """HTTP on ``settings.host:settings.http_port`` over the native transport, for ``app``
    (made by :func:`~tierserve.server.app.create_app`); ``start`` on the running loop,
    ``stop(grace)``."""

    def __init__(
        self, app: FastAPI, settings: Settings, reuse_port: bool = False, runtime: Any = None
    ) -> None:
        self.app = app
        self.plane: DataPlane = app.state.plane
        self.endpoint: InferEndpoint = app.state.infer_endpoint
        self.admission = app.state.admission
        self.limit = settings.max_request_bytes
        self.transport = _transport_class()(
            settings.host, settings.http_port, budget=app.state.budget, reuse_port=reuse_port,
            max_request_bytes=settings.max_request_bytes,
            max_header_bytes=settings.max_header_bytes,
            max_header_count=settings.max_header_count,
            header_timeout_s=settings.header_timeout_s, body_timeout_s=settings.body_timeout_s,
            keep_alive_timeout_s=settings.keep_alive_timeout_s,
            admission_timeout_s=settings.admission_timeout_s,
            max_connections=settings.max_connections,
            # HTTP keeps half of the reserve: gRPC refuses first, health still gets in
            max_descriptor=max_descriptor(settings.descriptor_reserve // 2),
            max_connection_bytes=settings.max_connection_bytes, runtime=runtime,
        )  # fmt: skip
        self.port: int = self.transport.port
        self.server = (settings.host, self.port)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        self._more: asyncio.Handle | None = None

    async def start(self) -> None:
        """Answer requests on the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.transport.fd, self._drain)
        self.plane.repository.subscribe(lambda entry, old: self._tell_models())
        self._tell_models()

    def _tell_models(self) -> None:
        """Tell the transport which models serve (it asks :meth:`InferEndpoint.refuse`
        about others before their body is read)."""
        entries = list(self.plane.repository.entries.values())
        self.transport.set_models({e.name: e.version for e in entries if e.handle is not None})

    async def stop(self, grace: float | None = None, give_up=None) -> None:
        """Stop accepting connections; answer the requests in flight, and those already
        sent on open connections (with ``Connection: close``), for up to ``grace`` seconds
        (or until ``give_up()``), until every connection has closed; then close."""
        transport = self.transport
        transport.begin_shutdown()
        deadline = time.monotonic() + (grace or 0.0)
        while (transport.in_flight or transport.connections) and time.monotonic() < deadline:
            if give_up is not None and give_up():
                break
            await asyncio.sleep(0.01)
        if self._loop is not None:
            self._loop.remove_reader(transport.fd)
        if self._more is not None:
            self._more.cancel()
        transport.close()

    # -- requests ----------------------------------------------------------------------------

    def _drain(self) -> None:
        """Answer the queued requests, at most :data:`DRAIN_CALLS` or :data:`DRAIN_BYTES` of
        bodies per loop step (as the gRPC transport's)."""
        self._more = None
        now = time.perf_counter()
        for item in self.transport.take(DRAIN_CALLS, DRAIN_BYTES):
            kind = item[0]
            if kind == "infer":
                self._group(now, *item[1:])
            elif kind == "raw":
                task = asyncio.ensure_future(self._asgi(*item[1:]))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            elif kind == "body":
                self._body(now, *item[1:])
            else:  # "gone": its client left before its turn
                self.endpoint.observe(item[1], now - item[2], "499")
        if self.transport.queued and self._loop is not None:
            self._more = self._loop.call_soon(self._drain)

    def _reply(self, call_id: int, status: int, payload: bytes, media: bytes, json_length) -> None:
        headers = [(b"content-type", media)]
        if json_length is not None:
            headers.append((b"inference-header-content-length", str(json_length).encode()))
        self.transport.reply(call_id, status, payload, headers)

    def _body(
        self, now, call_id, model, version, length, encoding, header_length, body, problem, age
    ) -> None:
        """An infer request the transport did not decode, as :class:`InferEndpoint`
        answers it: the model first, whatever the body holds.  ``body`` None: not read,
        ``problem`` says why: ``check`` (a model the transport does not know: status 0 lets
        it read the body), ``too large``, ``exceeded`` (a chunked body), ``busy``."""
        started = now - age
        reply = partial(self._reply, call_id)
        error = self.endpoint.refuse(model, version, length)
        if error is None and body is not None:
            alive = partial(self.transport.pending, call_id)
            self.endpoint.answer(
                model, version, body, encoding, header_length, started, reply, alive
            )
            return
        if error is None:
            if problem == "check":
                self.transport.reply(call_id, 0, b"")
                return
            error = (
                self.admission.busy
                if problem == "busy"
                else PayloadTooLargeError(
                    f"the request body exceeds the limit of {self.limit} bytes"
                )
            )
        self.endpoint.fail(model, error, started, reply)

    def _group(
        self, now, model, version, ids, rows, ages, request_ids, inputs, outputs, binary_output
    ) -> None:
        """Decoded infer requests of one signature: run as one request (in chunks of the
        model's ``max_batch_size``), each member answered from its rows of the outputs."""
        arrays = {
            name: np.frombuffer(data, DATATYPES[datatype]).reshape(shape)
            for name, datatype, shape, data in inputs
        }
        declared = {name: datatype for name, datatype, _, _ in inputs}
        requested = None if outputs is None else [RequestedOutput(n, b) for n, b in outputs]
        members = [(i, rows[i], now - ages[i], request_ids[i]) for i in range(len(ids))]
        entry = self.plane.repository.entries.get(model)
        handle = entry.handle if entry is not None else None
        most = handle.servable.max_batch_size if handle is not None else 0
        if len(members) > 1 and most > 0 and sum(rows) > most:
            chunks, chunk, size = [], [], 0
            for member in members:
                if chunk and size + member[1] > most:
                    chunks.append(chunk)
                    chunk, size = [], 0
                chunk.append(member)
                size += member[1]
            chunks.append(chunk)
        else:
            chunks = [members] if most > 0 or len(members) == 1 else [[m] for m in members]
        whole = len(chunks) == 1 and len(chunks[0]) == len(members)
        start = 0
        for chunk in chunks:
            count = sum(m[1] for m in chunk)
            part = arrays if whole else {n: a[start : start + count] for n, a in arrays.items()}
            start += count
            run = _Run(self, model, version, [ids[m[0]] for m in chunk], chunk)
            run.start(part, declared, requested, binary_output)

    async def _asgi(self, call_id, method, target, headers, body) -> None:
        """Any route but infer: the FastAPI app, called as an ASGI app."""
        raw_path, _, query = target.partition(b"?")
        try:
            path = unquote(raw_path.decode("ascii"))
        except UnicodeDecodeError:
            self.transport.reply(call_id, 400, _error_bytes({"error": "invalid request path"}), _JSON)
            return
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "method": method, "scheme": "http", "path": path,
            "raw_path": raw_path, "query_string": query, "root_path": "", "headers": headers,
            "server": self.server, "client": None,
        }  # fmt: skip
        answered = asyncio.Event()
        sent = False
        response: dict[str, Any] = {"status": 500, "headers": [], "body": []}

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await answered.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                response["status"] = message["status"]
                response["headers"] = message.get("headers", [])
                response["started"] = True
            elif message["type"] == "http.response.body":
                response["body"].append(message.get("body", b""))

        try:
            await self.app(scope, receive, send)
        except Exception:
            if not response.get("started"):  # the app's handlers log what they catch
                log.exception("%s %s failed", method, path[:200])
                self.transport.reply(call_id, 500, _error_bytes(INTERNAL_ERROR), _JSON)
                return
        finally:
            answered.set()
        self.transport.reply(
            call_id, response["status"], b"".join(response["body"]), list(response["headers"])
        )


class _Run:
    """One chunk of a group run as one request, its members answered from its outputs (a
    chunk the data plane refuses is run member by member, each answered on its own)."""

    __slots__ = ("http", "model", "version", "ids", "members")

    def __init__(self, http, model, version, ids, members) -> None:
        self.http: NativeHttpServer = http
        self.model, self.version = model, version
        #: the transport's request ids, and (index, rows, started, client's id) of each
        self.ids, self.members = ids, members

    def start(self, inputs, declared, requested, binary_output) -> None:
        http = self.http
        transport = http.transport
        alone = len(self.ids) == 1
        decoded = DecodedRequest(
            inputs=inputs, declared=declared, outputs=requested,
            id=self.members[0][3] if alone else "", binary_output=binary_output,
        )  # fmt: skip
        alive = partial(transport.pending, self.ids[0]) if alone else partial(
            transport.any_pending, self.ids
        )
        try:
            http.plane.start_infer(
                model_name(self.model), self.version, decoded, self.done, alive,
                sizes=None if alone else [m[1] for m in self.members],
            )  # fmt: skip
        except Exception as exc:
            if alone:
                self.fail(exc)
                return
            # one member's inputs (values, key counts) may be what the checks refuse: each
            # member is run on its own, so each gets its own answer
            start = 0
            for i, member in zip(self.ids, self.members):
                part = {n: a[start : start + member[1]] for n, a in inputs.items()}
                start += member[1]
                _Run(http, self.model, self.version, [i], [member]).start(
                    part, declared, requested, binary_output
                )

    def done(self, result, exc: BaseException | None) -> None:
        if exc is not None:
            self.fail(exc)
            return
        try:
            outputs = [
                (name, datatype_of(array), array.shape, _little(array), result.binary[name])
                for name, array in result.outputs.items()
            ]
            if any(o[1] not in _ENCODED for o in outputs):
                delivered = self._encode_here(result)
            else:
                rows = [m[1] for m in self.members] if len(self.ids) > 1 else None
                delivered = self.http.transport.reply_infer(
                    self.ids, rows, result.model_name, result.model_version,
                    [m[3] for m in self.members], outputs,
                )  # fmt: skip
        except Exception as error:
            self.fail(error)
            return
        for member, ok in zip(self.members, delivered):
            self.http.endpoint.observe(self.model, member[2], None if ok else "499")

    def _encode_here(self, result) -> list[bool]:
        """Each member's answer encoded by Python (outputs of datatypes the transport does
        not encode)."""
        delivered, start = [], 0
        for call_id, member in zip(self.ids, self.members):
            outputs = result.outputs
            if len(self.ids) > 1:
                outputs = {n: a[start : start + member[1]] for n, a in outputs.items()}
                start += member[1]
            payload, json_length = encode_rest_response(
                result.model_name, result.model_version, member[3], outputs, result.binary
            )
            media = _BINARY if json_length is not None else b"application/json"
            headers = [(b"content-type", media)]
            if json_length is not None:
                headers.append((b"inference-header-content-length", str(json_length).encode()))
            delivered.append(self.http.transport.reply(call_id, 200, payload, headers))
        return delivered

    def fail(self, exc: BaseException) -> None:
        http = self.http
        for call_id, member in zip(self.ids, self.members):
            http.endpoint.fail(self.model, exc, member[2], partial(http._reply, call_id))


def _little(array: np.ndarray) -> bytes:
    """``array``'s values, little-endian, row-major."""
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return np.ascontiguousarray(array).tobytes()
