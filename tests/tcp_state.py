"""What the kernel says about TCP sockets on 127.0.0.1 (Linux ``/proc/net/tcp``), for tests
that wait on a server's sockets: a connection's bytes read by the server, a port that
stopped listening."""

from __future__ import annotations

from pathlib import Path

_LISTEN = "0A"


def _rows() -> list[list[str]]:
    lines = Path("/proc/net/tcp").read_text().splitlines()[1:]
    return [line.split() for line in lines]


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1], 16)


def listening(port: int) -> bool:
    """Whether a socket listens on ``port``."""
    return any(_port(r[1]) == port and r[3] == _LISTEN for r in _rows())


def unread_by_server(server_port: int, client_port: int) -> int | None:
    """Bytes the client at ``client_port`` sent that the server's side of the connection
    has not read yet; None while there is no such connection."""
    for r in _rows():
        if _port(r[1]) == server_port and _port(r[2]) == client_port and r[3] != _LISTEN:
            return int(r[4].split(":")[1], 16)  # rx_queue
    return None
