"""uvicorn's httptools protocol, writing each response in one ``send`` instead of two.

uvicorn writes a response's status line and headers when the app sends
``http.response.start`` and the body when it sends ``http.response.body``: two ``send``
system calls, two TCP segments and, for a client waiting on the reply, two wakeups.  Here the
connection's transport gathers what is written during one event-loop step and writes it at
the end of that step, so a response whose start and body are sent together (every response
of this server) goes out in one ``send``.  Large writes are not held back.
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
    """``HttpToolsProtocol`` over a :class:`GatheringTransport`."""

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(GatheringTransport(transport, asyncio.get_running_loop()))
