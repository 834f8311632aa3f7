"""Free loopback ports and a check that something listens on one."""

from __future__ import annotations

import contextlib
import socket

HOST = "127.0.0.1"


def free_ports(count: int) -> list[int]:
    """Return ``count`` distinct ports that were free on 127.0.0.1 a moment ago.

    All sockets are held open until every port is chosen, so the ports differ from each other.
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((HOST, 0))
            ports.append(sock.getsockname()[1])
        return ports


def free_port() -> int:
    """Return one port that was free on 127.0.0.1 a moment ago."""
    return free_ports(1)[0]


def port_open(port: int, host: str = HOST) -> bool:
    """True when a TCP connection to host:port succeeds."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0
