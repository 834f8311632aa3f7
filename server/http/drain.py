"""Graceful shutdown that loses no request already sent.

uvicorn's shutdown closes its listening sockets first, which resets the connections the
kernel accepted and the server had not taken yet (a client's request sent on one is lost),
and closes every connection between requests at once, which loses a request whose bytes
have arrived but were not read yet.  :class:`Server` takes what waits in the listeners'
accept queues before closing them, and uvicorn answers the requests it has started before it
closes their connections.  The native HTTP transport drains in Rust
(:mod:`.native_server`).  And it exits like a
worker pool does, with status 0 after a drain, where uvicorn re-raises the signal it caught
(the process then dies of SIGTERM).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import uvicorn

#: How long shutdown waits for the accept queues to empty (connections keep arriving while
#: the listeners are open; what arrives after this is refused).
ACCEPT_QUEUE_WAIT_S = 1.0


def accept_queue(sock) -> int:
    """Connections waiting in listening socket ``sock``'s accept queue (Linux: TCP_INFO's
    ``tcpi_unacked`` on a listener); 0 where it cannot be read."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    except (OSError, AttributeError, ValueError):
        return 0
    return struct.unpack_from("I", info, 24)[0] if len(info) >= 28 else 0


class Server(uvicorn.Server):
    """uvicorn's server, draining as the module docstring says."""

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        self._captured_signals.clear()  # drained: exit 0, not by the signal

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        listeners = [s for server in self.servers for s in server.sockets or ()]
        listeners += sockets or []
        deadline = time.monotonic() + ACCEPT_QUEUE_WAIT_S
        while any(accept_queue(s) for s in listeners) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # the loop accepts them meanwhile
        await super().shutdown(sockets)
