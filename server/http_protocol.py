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
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

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


class _Sweep:
    """Closes the connections of one event loop whose deadline passed, checking every
    ``interval`` seconds while there are connections."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.connections: set[GatheringHttpToolsProtocol] = set()
        self.interval = 0.25
        self._timer: asyncio.TimerHandle | None = None

    def add(self, connection: GatheringHttpToolsProtocol, shortest: float) -> None:
        self.connections.add(connection)
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
        if self.connections:
            self._timer = self.loop.call_later(self.interval, self._tick)
        elif _sweeps.get(self.loop) is self:
            del _sweeps[self.loop]  # no connection left: no timer, and the loop is not held


_sweeps: dict[asyncio.AbstractEventLoop, _Sweep] = {}


class GatheringHttpToolsProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` over a :class:`GatheringTransport`, with read timeouts (see the
    module docstring; ``None``: no timeout)."""

    def __init__(
        self, *args: Any, header_timeout: float | None = None, body_timeout: float | None = None,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        super().__init__(*args, **kwargs)
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        #: loop time at which this connection is closed (None: never)
        self.deadline: float | None = None
        # "open": no byte yet; "reading": a request's first byte came, its body is not all in;
        # "idle": kept alive between requests
        self._phase = "open"
        self._sweep: _Sweep | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        loop = asyncio.get_running_loop()
        super().connection_made(GatheringTransport(transport, loop))
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
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase == "idle":  # bytes after an idle spell: the keep-alive deadline is off
            self.deadline = None
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._phase == "idle":  # the first byte of a request on a kept-alive connection
            self._arm(self.header_timeout)
        self._phase = "reading"

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.body_timeout)

    def on_message_complete(self) -> None:
        self._phase = "idle"
        self.deadline = None
        super().on_message_complete()

    def on_response_complete(self) -> None:
        # uvicorn's, with the keep-alive timeout as a deadline instead of a timer
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif self._phase == "idle":
            self._arm(self.timeout_keep_alive)

    def _arm(self, seconds: float | None) -> None:
        self.deadline = None if seconds is None else self.loop.time() + seconds

    def timed_out(self) -> None:
        """Close the connection: its deadline passed."""
        self.deadline = None
        if not self.transport.is_closing():
            self.transport.close()
