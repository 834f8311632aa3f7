"""Hostile clients against a real ``tierserve serve`` process: a raw HTTP/2 client that sends
gRPC calls frame by frame (bodies that never end, connections that never speak), and the
server process with its memory.

:class:`H2Connection` drives the ``h2`` library's protocol state machine over a plain
socket, so a test decides every frame the server receives (headers without a body, a body
that stops one byte short) while ``h2`` keeps the flow-control windows and settings right.
"""

from __future__ import annotations

import contextlib
import select
import socket
import subprocess
import sys
import time
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import httpx

from tierserve.server.app import free_port

INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"


class H2Connection:
    """One HTTP/2 connection sending gRPC calls by hand; see the module docstring."""

    def __init__(self, host: str, port: int) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        self.authority = f"{host}:{port}"
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        self.statuses: dict[int, str] = {}  # stream -> grpc-status ("" when reset)
        self.closed = self.goaway = False
        self._buffer = b""
        self._flush()

    def _flush(self) -> None:
        data = self.h2.data_to_send()
        if data and not self.closed:
            try:
                self.sock.sendall(data)
            except OSError:
                self.closed = True

    def open(self, path: str = INFER_PATH, **headers: str) -> int:
        """Send the headers of a new call (its body follows); its stream id."""
        stream = self.h2.get_next_available_stream_id()
        fields = [(":method", "POST"), (":scheme", "http"), (":path", path),
                  (":authority", self.authority), ("content-type", "application/grpc"),
                  ("te", "trailers"), *headers.items()]  # fmt: skip
        self.h2.send_headers(stream, fields)
        self._flush()
        return stream

    def send(self, stream: int, data: bytes, end: bool = False, wait: float = 0.0) -> int:
        """Send what the flow-control windows allow of ``data`` on ``stream``, waiting up to
        ``wait`` seconds for more window; the bytes sent."""
        sent, deadline = 0, time.monotonic() + wait
        while sent < len(data) and not self.closed and stream not in self.statuses:
            try:
                room = min(
                    self.h2.local_flow_control_window(stream),
                    self.h2.max_outbound_frame_size, len(data) - sent,
                )  # fmt: skip
            except h2.exceptions.StreamClosedError:
                break
            if room <= 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.pump(left)
                continue
            last = end and sent + room == len(data)
            self.h2.send_data(stream, data[sent : sent + room], end_stream=last)
            self._flush()
            sent += room
        return sent

    def pump(self, timeout: float = 0.0) -> bool:
        """Read and handle what the server sent within ``timeout``; False when nothing came."""
        if self.closed:
            return False
        poller = select.poll()  # not select(): a test may hold more than 1,024 descriptors
        poller.register(self.sock, select.POLLIN)
        if not poller.poll(timeout * 1000):
            return False
        try:
            chunk = self.sock.recv(1 << 20)
        except OSError:
            chunk = b""
        if not chunk:
            self.closed = True
            return True
        self._buffer += chunk
        while len(self._buffer) >= 9:  # frame by frame: see _after_goaway
            end = 9 + int.from_bytes(self._buffer[:3], "big")
            if len(self._buffer) < end:
                break
            raw, self._buffer = self._buffer[:end], self._buffer[end:]
            if self.goaway:
                self._after_goaway(raw)
                continue
            try:
                events = self.h2.receive_data(raw)
            except h2.exceptions.ProtocolError:
                self.closed = True
                return True
            for event in events:
                self._handle(event)
        self._flush()
        return True

    def _handle(self, event) -> None:
        if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
            status = dict(event.headers).get(b"grpc-status")
            if status is not None:
                self.statuses[event.stream_id] = status.decode()
        elif isinstance(event, h2.events.StreamReset):
            self.statuses.setdefault(event.stream_id, "")
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = True

    def _after_goaway(self, raw: bytes) -> None:
        """One frame after a GOAWAY, which ``h2`` takes as the end of the connection although
        the server still answers the calls it had (a graceful shutdown): answers decoded
        with ``h2``'s header decoder, PINGs acknowledged."""
        kind, flags = raw[3], raw[4]
        stream = int.from_bytes(raw[5:9], "big") & 0x7FFFFFFF
        payload = raw[9:]
        if kind == 1:  # HEADERS (hyper sends them unpadded, without priority)
            fields = dict(self.h2.decoder.decode(payload, raw=True))
            if b"grpc-status" in fields:
                self.statuses[stream] = fields[b"grpc-status"].decode()
        elif kind == 3:  # RST_STREAM
            self.statuses.setdefault(stream, "")
        elif kind == 6 and not flags & 1:  # PING: the server's graceful shutdown waits for it
            header = len(payload).to_bytes(3, "big") + bytes([6, 1]) + bytes(4)
            with contextlib.suppress(OSError):
                self.sock.sendall(header + payload)

    def status(self, stream: int, timeout: float) -> str | None:
        """The grpc-status the server answered ``stream`` with, "" when it reset the stream,
        None when it has not answered within ``timeout``."""
        deadline = time.monotonic() + timeout
        while stream not in self.statuses and not self.closed and time.monotonic() < deadline:
            self.pump(min(0.1, max(0.0, deadline - time.monotonic())))
        return self.statuses.get(stream)

    def close(self) -> None:
        self.closed = True
        self.sock.close()


def grpc_message(length: int) -> bytes:
    """The 5-byte prefix of an uncompressed gRPC message of ``length`` bytes."""
    return b"\x00" + length.to_bytes(4, "big")


def rss_mib(pid: int) -> float:
    """Resident anonymous memory of ``pid`` in MiB (its heap and mappings, not the pages of
    shared libraries, which come in when first used and stay)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon")


class ServerProcess:
    """``tierserve serve`` in a subprocess on free ports, with its log; ``nofile`` sets its
    descriptor limit."""

    def __init__(self, repo: Path, *args: str, nofile: int | None = None) -> None:
        self.http, self.grpc = free_port(), free_port()
        self.log = repo.parent / f"serve-{self.http}.log"

        def limit() -> None:
            if nofile is not None:
                import resource

                resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tierserve.clients.cli", "serve", "--model-repository",
             str(repo), "--http-port", str(self.http), "--grpc-port", str(self.grpc),
             "--threads", "2", "--poll-interval", "0", "--log-level", "warning", *args],
            stdout=self.log.open("w"), stderr=subprocess.STDOUT, preexec_fn=limit,
        )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.http}"
        self.grpc_url = f"127.0.0.1:{self.grpc}"

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/v2/health/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def rss(self) -> float:
        return rss_mib(self.proc.pid)

    def descriptors(self) -> int:
        return len(list(Path(f"/proc/{self.proc.pid}/fd").iterdir()))

    def text(self) -> str:
        return self.log.read_text()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
