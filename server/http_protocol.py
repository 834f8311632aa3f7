"""uvicorn's httptools protocol, writing each response in one ``send`` instead of two.

uvicorn writes a response's status line and headers when the app sends
``http.response.start`` and the body when it sends ``http.response.body``: two ``send``
system calls, two TCP segments and, for a client waiting on the reply, two wakeups.  Here the
connection's transport gathers what is written during one event-loop step and writes it at
the end of that step, so a response whose start and body are sent together (every response
of this server) goes out in one ``send``.  Large writes are not held back.

It also closes connections that hold the server without sending a request: one whose request
headers are not all in ``header_timeout`` seconds after its first byte (or after it opened),
or whose body is not all in ``body_timeout`` seconds after its headers (slowloris).  uvicorn
itself only times out idle keep-alive connections between requests.
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
        self._read_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(GatheringTransport(transport, asyncio.get_running_loop()))
        self._arm(self.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._read_timer is None:  # the first byte of a request on a kept-alive connection
            self._arm(self.header_timeout)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        self._arm(self.body_timeout)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self, seconds: float | None) -> None:
        self._disarm()
        if seconds is not None:
            self._read_timer = self.loop.call_later(seconds, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if not self.transport.is_closing():
            self.transport.close()
