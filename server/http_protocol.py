"""uvicorn's httptools protocol, writing each response in one ``send`` instead of two.

uvicorn writes a response's status line and headers when the app sends
``http.response.start`` and the body when it sends ``http.response.body``: two ``send``
system calls, two TCP segments and, for a client waiting on the reply, two wakeups.  Here the
connection's transport gathers what is written during one event-loop step and writes it at
the end of that step, so a response whose start and body are sent together (every response
of this server) goes out in one ``send``.  Large writes are not held back.

It also closes connections that hold the server without sending a request: one whose request
headers are not all in ``header_timeout`` seconds after its first byte (or after it opened),
or whose body is not all in ``body_timeout`` seconds after its headers (slowloris), and, as
uvicorn does, one idle for ``timeout_keep_alive`` between requests.  These deadlines are
timestamps that one sweep per event loop checks a few times a second, not a timer armed and
cancelled per request (uvicorn's keep-alive timer and two read timers cost about 5% of a
batch-1 request's CPU).

It holds every connection and request to :class:`Limits`: a request line and headers over
``max_header_bytes`` or ``max_header_count`` are refused (414 for the URL, else 431) as soon
as they pass it, before more is read; a connection beyond ``max_connections``, or whose
descriptor reaches into the reserve, gets a 503 and is closed; an infer request takes its
room in the worker's budget (:mod:`.admission`) before its body is read, and waits for it,
reading nothing, until ``admission_timeout_s`` (then 503).  On shutdown (:meth:`shutdown`) a
connection is closed at once only when no byte of a next request has arrived; a request
that has is answered first, with ``Connection: close``.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import logging
import re
import termios
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from tierserve.core.errors import PayloadTooLargeError

from .admission import Admission, max_descriptor
from .tensors import dump_json

if TYPE_CHECKING:
    from .rest import InferEndpoint
    from .settings import Settings

log = logging.getLogger("tierserve.server")

#: Writes at least this large go out at once (after what is pending).
LARGE = 1 << 16


class GatheringTransport:
    """An ``asyncio.Transport`` proxy whose ``write`` is sent at the end of the loop step."""

    __slots__ = ("_transport", "_loop", "_pending")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes) -> None:
        if len(data) >= LARGE:
            self.flush()
            self._transport.write(data)
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        pending = self._pending
        if not pending:
            return
        self._pending = []
        if not self._transport.is_closing():
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


@dataclass(frozen=True)
class Limits:
    """What :class:`GatheringHttpToolsProtocol` holds connections and requests to (the
    settings of the same names; ``None`` timeouts: none)."""

    admission: Admission
    header_timeout: float | None = None
    body_timeout: float | None = None
    max_header_bytes: int = 64 * 1024
    max_header_count: int = 100
    max_connections: int = 4096
    #: accepted sockets numbered this or higher are refused (the descriptor reserve)
    max_descriptor: int = 2**31 - 1

    @classmethod
    def of(cls, settings: Settings, admission: Admission) -> Limits:
        return cls(
            admission, settings.header_timeout_s, settings.body_timeout_s,
            settings.max_header_bytes, settings.max_header_count, settings.max_connections,
            # HTTP keeps half of the reserve: gRPC refuses first, health still gets in
            max_descriptor(settings.descriptor_reserve // 2),
        )  # fmt: skip


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that is refused."""


def _unread(transport: asyncio.Transport) -> int:
    """Bytes waiting in the kernel to be read from ``transport``'s socket (0 when unknown)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    count = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.FIONREAD, count)
    except (OSError, ValueError):
        return 0
    return count[0]


class _Sweep:
    """Closes the connections of one event loop whose deadline passed, checking every
    ``interval`` seconds while there are connections."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.connections: set[GatheringHttpToolsProtocol] = set()
        self.interval = 0.25
        self.admissions: set[Admission] = set()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, connection: GatheringHttpToolsProtocol, shortest: float) -> None:
        self.connections.add(connection)
        self.admissions.add(connection.limits.admission)
        # a deadline is kept within a quarter of the shortest timeout (and 0.25 s)
        self.interval = max(0.005, min(self.interval, shortest / 4))
        if self._timer is None:
            self._timer = self.loop.call_later(self.interval, self._tick)

    def _tick(self) -> None:
        self._timer = None
        now = self.loop.time()
        for connection in list(self.connections):
            deadline = connection.deadline
            if deadline is not None and now >= deadline:
                connection.timed_out()
        for admission in self.admissions:  # room the gRPC transport gave back; expiries
            admission.waiters.admit()
        if self.connections:
            self._timer = self.loop.call_later(self.interval, self._tick)
        elif _sweeps.get(self.loop) is self:
            del _sweeps[self.loop]  # no connection left: no timer, and the loop is not held


_sweeps: dict[asyncio.AbstractEventLoop, _Sweep] = {}


#: ``POST /v2/models/{m}[/versions/{v}]/infer`` as the client sent it (no query string).  A
#: path with percent escapes or bytes outside printable ASCII is left to the ASGI app, which
#: unquotes (or refuses) it as for any route.
_INFER_PATH = re.compile(rb"/v2/models/([!-$&-.0->@-~]+)(?:/versions/([!-$&-.0->@-~]+))?/infer")


class _NoEvent:
    """What uvicorn's ``connection_lost`` sets on a request cycle; an infer cycle waits on
    nothing."""

    @staticmethod
    def set() -> None:
        pass


class _InferCycle:
    """One ``POST .../infer`` served by the protocol itself (see
    :class:`GatheringHttpToolsProtocol`); it has the attributes uvicorn's protocol reads of
    its request cycles (``response_complete``, ``disconnected``, ``keep_alive``,
    ``message_event``)."""

    __slots__ = (
        "model", "version", "length", "header_length", "encoding", "keep_alive", "expect_100",
        "chunks", "size", "started", "active", "body_done", "response_complete", "disconnected",
        "error", "held", "waiter",
    )  # fmt: skip
    message_event = _NoEvent

    def alive(self) -> bool:
        """Whether its client is still connected (a batched request of a client that hung
        up is dropped before it runs)."""
        return not self.disconnected

    def __init__(self, model: str, version: str, keep_alive: bool, expect_100: bool) -> None:
        self.model = model
        self.version = version
        self.keep_alive = keep_alive
        self.expect_100 = expect_100
        self.length: str | None = None
        self.header_length: str | None = None
        self.encoding: str | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.started = time.perf_counter()
        self.active = False  # its turn on the connection came (earlier answers are out)
        self.body_done = False
        self.response_complete = False
        self.disconnected = False
        self.error: Exception | None = None  # known before its turn: answered when it comes
        self.held: int | None = None  # the bytes of the budget it holds (with one call)
        self.waiter = None  # waiting for room in the budget


class GatheringHttpToolsProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` over a :class:`GatheringTransport`, within ``limits`` (see the
    module docstring).

    Given ``infer`` (the app's :class:`~tierserve.server.rest.InferEndpoint`), it answers
    ``POST /v2/models/{m}[/versions/{v}]/infer`` itself, from the parser's callbacks into
    the data plane, without an ASGI scope, task or messages: the same answers, limits,
    metrics and logging as the app's infer route, at a fraction of the per-request cost.
    Every other request (and an infer path with percent escapes) goes to the ASGI app.
    """

    def __init__(
        self,
        *args: Any,
        limits: Limits | None = None,
        infer: InferEndpoint | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if limits is None:  # the default settings, with a budget of its own
            from .admission import LocalBudget
            from .settings import Settings

            settings = Settings()
            budget = LocalBudget(settings.max_inflight_bytes, settings.max_inflight_calls)
            limits = Limits.of(settings, Admission(budget, settings))
        self.limits = limits
        self.header_timeout = limits.header_timeout
        self.body_timeout = limits.body_timeout
        self.infer = infer
        #: loop time at which this connection is closed (None: never)
        self.deadline: float | None = None
        # "open": no byte yet; "reading": a request's first byte came, its body is not all in;
        # "idle": kept alive between requests
        self._phase = "open"
        self._sweep: _Sweep | None = None
        # bytes of the current request's head received so far (while it is not all in)
        self._in_head = True
        self._head = 0
        self._fields = 0  # bytes of the current request's header fields parsed so far
        self._refusal: tuple[int, str] | None = None
        self._draining = False

    def connection_made(self, transport) -> None:  # type: ignore[override]
        loop = asyncio.get_running_loop()
        super().connection_made(GatheringTransport(transport, loop))
        sock = transport.get_extra_info("socket")
        limits = self.limits
        if (sock is not None and sock.fileno() >= limits.max_descriptor) or len(
            self.connections
        ) > limits.max_connections:
            self._refuse(503, "the server has too many connections open; retry later")
            return
        sweep = _sweeps.get(loop)
        if sweep is None:
            sweep = _sweeps[loop] = _Sweep(loop)
        timeouts = [self.timeout_keep_alive, self.header_timeout, self.body_timeout]
        sweep.add(self, min(t for t in timeouts if t is not None))
        self._sweep = sweep
        self._arm(self.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self.deadline = None
        if self._sweep is not None:
            self._sweep.connections.discard(self)
        cycle = self._infer_active
        if (
            cycle is not None
            and not cycle.response_complete
            and (not cycle.body_done or cycle.waiter is not None)
        ):
            # gone before its body was in (or it had room to run): nginx's 499, as the app's
            # route counts it
            cycle.response_complete = True
            self._infer_release(cycle)
            self.infer.observe(cycle.model, cycle.started, "499")
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # uvicorn's, with the head's size bounded and the refusals answered as such
        if self._phase == "idle":  # bytes after an idle spell: the keep-alive deadline is off
            self.deadline = None
        if self._in_head:
            self._head += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            if self._refusal is not None:
                self._refuse(*self._refusal)
            else:
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
            return
        if self._in_head and self._head > self.limits.max_header_bytes:
            self._refuse(431, self._too_large("request line and headers", "max_header_bytes"))

    def _too_large(self, what: str, setting: str) -> str:
        return f"the {what} exceed {setting} ({getattr(self.limits, setting)})"

    def _refuse(self, status: int, message: str) -> None:
        """Answer ``status`` with ``{"error": message}`` and close the connection."""
        self._in_head = False
        self.deadline = None
        transport = self.transport
        if transport.is_closing():
            return
        body = dump_json({"error": message})
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += (name, b": ", value, b"\r\n")
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
        head.append(b"connection: close\r\n\r\n")
        transport.write(b"".join(head) + body)
        transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._fields = 0
        if self._phase == "idle":  # the first byte of a request on a kept-alive connection
            self._arm(self.header_timeout)
        self._phase = "reading"

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.limits.max_header_bytes:
            self._refusal = (414, self._too_large("request URL", "max_header_bytes"))
            raise _Refused

    def on_header(self, name: bytes, value: bytes) -> None:
        # the head as parsed (one read may hold all of it): URL, fields and their separators
        self._fields += len(name) + len(value) + 4
        if self._fields + len(self.url) > self.limits.max_header_bytes:
            self._refusal = (431, self._too_large("request line and headers", "max_header_bytes"))
            raise _Refused
        if len(self.headers) >= self.limits.max_header_count:
            self._refusal = (431, self._too_large("header lines", "max_header_count"))
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        cycle = self._infer_cycle() if self.infer is not None else None
        if cycle is None:
            super().on_headers_complete()
            if self._draining and self.cycle is not None:
                self.cycle.keep_alive = False
        else:
            if self._draining:
                cycle.keep_alive = False
            existing, self.cycle = self.cycle, cycle  # type: ignore[assignment]
            if existing is None or existing.response_complete:
                self._infer_start(cycle)
            else:  # pipelined behind an answer not sent yet: its turn comes after it
                self.flow.pause_reading()
                self.pipeline.appendleft((cycle, None))  # type: ignore[arg-type]
        self._arm(self.body_timeout)

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is not _InferCycle:
            super().on_body(body)
            return
        if cycle.response_complete or cycle.error is not None:
            return  # answered already (or will be with an error): the rest is dropped
        cycle.size += len(body)
        if cycle.size > self.infer.limit:
            cycle.chunks = []
            cycle.error = PayloadTooLargeError(
                f"the request body exceeds the limit of {self.infer.limit} bytes"
            )
            if cycle.active and cycle.waiter is None:
                self._infer_fail(cycle)
            return
        cycle.chunks.append(body)

    def on_message_complete(self) -> None:
        self._phase = "idle"
        self._in_head = True  # the next request's head
        self._head = 0
        self.deadline = None
        cycle = self.cycle
        if type(cycle) is not _InferCycle:
            super().on_message_complete()
            return
        cycle.body_done = True
        if cycle.active and not cycle.response_complete and cycle.waiter is None:
            self._infer_run(cycle)

    def on_response_complete(self) -> None:
        # uvicorn's, with the keep-alive timeout as a deadline instead of a timer
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            if type(cycle) is _InferCycle:
                self._infer_start(cycle)  # type: ignore[arg-type]
            else:
                self._start_asgi_task(cycle, app)
        elif self._phase == "idle":
            self._arm(self.timeout_keep_alive)

    def shutdown(self) -> None:
        """Begin a graceful shutdown: a connection between requests closes at once unless a
        next request has begun to arrive (bytes read or waiting in the kernel); a request in
        progress, or that arrives, is answered with ``Connection: close``."""
        self._draining = True
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False
        elif not (self._phase == "reading" or self._head or _unread(self.transport)):
            self.transport.close()

    # -- infer requests answered here (see the class docstring) -----------------------------

    _infer_active: _InferCycle | None = None

    def _infer_cycle(self) -> _InferCycle | None:
        """A cycle for this request when the protocol answers it itself, else None."""
        parser = self.parser
        if parser.get_method() != b"POST" or self.root_path or self.limit_concurrency:
            return None
        url = self.url
        query = url.find(b"?")
        match = _INFER_PATH.fullmatch(url if query < 0 else url[:query])
        if match is None or parser.should_upgrade():
            return None
        model, version = match.group(1), match.group(2)
        keep_alive = parser.get_http_version() != "1.0" and parser.should_keep_alive()
        cycle = _InferCycle(
            model.decode("ascii"), version.decode("ascii") if version else "", keep_alive,
            self.expect_100_continue,
        )  # fmt: skip
        for name, value in self.headers:
            if name == b"content-length":
                cycle.length = value.decode("latin-1")
            elif name == b"inference-header-content-length":
                cycle.header_length = value.decode("latin-1")
            elif name == b"content-encoding":
                cycle.encoding = value.decode("latin-1")
        return cycle

    def _infer_start(self, cycle: _InferCycle) -> None:
        """``cycle``'s turn: refuse it early as the app's route does (unknown model, declared
        size over the limit), else take its room in the budget, waiting for it with nothing
        read (see :meth:`_infer_admitted`)."""
        cycle.active = True
        self._infer_active = cycle
        if cycle.error is None:
            cycle.error = self.infer.refuse(cycle.model, cycle.version, cycle.length)
        if cycle.error is not None:
            self._infer_fail(cycle)
            return
        admission = self.limits.admission
        need = int(cycle.length) if cycle.length is not None else admission.undeclared
        if not admission.waiters and admission.budget.try_take(1, need):
            cycle.held = need
            self._infer_admitted(cycle)
            return
        self.flow.pause_reading()
        cycle.waiter = True  # waiting: wait() may admit it at once, which clears this
        waiter = admission.waiters.wait(
            1, need, lambda: self._infer_admitted(cycle, need), lambda: self._infer_busy(cycle)
        )  # fmt: skip
        if cycle.waiter is True:
            cycle.waiter = waiter

    def _infer_admitted(self, cycle: _InferCycle, taken: int | None = None) -> None:
        """``cycle`` has its room: ask for its body (100-continue) or answer it."""
        if taken is not None:  # after a wait
            cycle.held, cycle.waiter = taken, None
            if cycle.response_complete or cycle.disconnected:
                self._infer_release(cycle)
                return
            self.flow.resume_reading()
        if cycle.error is not None:  # its body passed the limit while it waited
            self._infer_fail(cycle)
        elif cycle.body_done:
            self._infer_run(cycle)
        elif cycle.expect_100 and not self.transport.is_closing():
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def _infer_busy(self, cycle: _InferCycle) -> None:
        """No room for ``cycle`` within the admission timeout: 503, and the connection closes
        (its body is unread)."""
        cycle.waiter = None
        if cycle.response_complete:
            return
        cycle.keep_alive = False
        cycle.chunks = []
        cycle.error = self.limits.admission.busy
        self._infer_fail(cycle)

    def _infer_release(self, cycle: _InferCycle) -> None:
        """Give back the room ``cycle`` holds (or stop its wait)."""
        if cycle.held is not None:
            held, cycle.held = cycle.held, None
            self.limits.admission.give(1, held)
        elif cycle.waiter is not None and cycle.waiter is not True:
            cycle.waiter.cancelled = True
            cycle.waiter = None

    def _infer_run(self, cycle: _InferCycle) -> None:
        chunks = cycle.chunks
        cycle.chunks = []
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self.infer.answer(
            cycle.model, cycle.version, body, cycle.encoding, cycle.header_length, cycle.started,
            lambda status, payload, media, json_length: self._infer_reply(
                cycle, status, payload, media, json_length
            ),
            cycle.alive,
        )  # fmt: skip

    def _infer_fail(self, cycle: _InferCycle) -> None:
        self.infer.fail(
            cycle.model, cycle.error, cycle.started,
            lambda status, payload, media, json_length: self._infer_reply(
                cycle, status, payload, media, json_length
            ),
        )  # fmt: skip

    def _infer_reply(
        self, cycle: _InferCycle, status: int, payload: bytes, media: bytes, json_length
    ) -> None:
        """Write ``cycle``'s response as uvicorn writes the app's (its default headers
        first), then start the next pipelined request."""
        if cycle.response_complete:
            return
        cycle.response_complete = True
        self._infer_release(cycle)
        if self._infer_active is cycle:
            self._infer_active = None
        transport = self.transport
        if cycle.disconnected or transport.is_closing():
            return
        head = [STATUS_LINE.get(status) or b"HTTP/1.1 %d \r\n" % status]  # 499 has no phrase
        for name, value in self.server_state.default_headers:
            head += (name, b": ", value, b"\r\n")
        head.append(b"content-length: %d\r\ncontent-type: %s\r\n" % (len(payload), media))
        if json_length is not None:
            head.append(b"inference-header-content-length: %d\r\n" % json_length)
        if not cycle.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        transport.write(b"".join(head))
        transport.write(payload)
        if not cycle.keep_alive:
            transport.close()
        self.on_response_complete()

    def _arm(self, seconds: float | None) -> None:
        self.deadline = None if seconds is None else self.loop.time() + seconds

    def timed_out(self) -> None:
        """Close the connection: its deadline passed."""
        self.deadline = None
        if not self.transport.is_closing():
            self.transport.close()
