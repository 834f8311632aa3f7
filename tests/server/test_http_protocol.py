"""The HTTP protocol: writes of one loop step leave in one write, in order; deadlines close
idle and stalled connections; a request whose client hung up before its batch ran is
dropped."""

from __future__ import annotations

import asyncio

from tierserve.server.http_protocol import LARGE, GatheringTransport


class Recorder:
    def __init__(self):
        self.writes, self.closed = [], False

    def write(self, data):
        self.writes.append(bytes(data))

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True

    def get_extra_info(self, name, default=None):
        return f"info:{name}"


def test_one_write_per_loop_step_and_close_flushes():
    async def main():
        raw = Recorder()
        t = GatheringTransport(raw, asyncio.get_running_loop())
        t.write(b"HTTP/1.1 200 OK\r\n\r\n")
        t.write(b"body")
        assert raw.writes == []
        await asyncio.sleep(0)  # one loop step: the gathered writes go out at its end
        assert raw.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
        big = b"x" * LARGE
        t.write(b"head")
        t.write(big)  # large: what is pending, then it, at once
        assert raw.writes[1:] == [b"head", big]
        t.write(b"last")
        t.close()
        assert raw.writes[-1] == b"last" and raw.closed
        assert t.get_extra_info("peername") == "info:peername"  # the rest is delegated
        await asyncio.sleep(0)
        assert raw.writes[-1] == b"last" and len(raw.writes) == 4

    asyncio.run(main())


def test_deadlines_close_idle_and_stalled_connections_and_spare_busy_ones(tiny_repository):
    """Keep-alive, header and body deadlines (one sweep per loop, no timer per request)."""
    import socket
    import time

    from polling import until

    from tierserve.server.app import BackgroundServer
    from tierserve.server.settings import Settings

    def closed(s: socket.socket) -> bool:
        timeout = s.gettimeout()
        s.settimeout(0.01)
        try:
            return s.recv(1024) == b""
        except TimeoutError:
            return False
        except OSError:
            return True
        finally:
            s.settimeout(timeout)  # the next recv waits as long as before, not 10 ms

    settings = Settings.build(
        model_repository=tiny_repository(), http_port=0, grpc_port=None, poll_interval_s=0,
        header_timeout_s=2.0, body_timeout_s=2.0, keep_alive_timeout_s=1.5,
    )  # fmt: skip
    live = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    with BackgroundServer(settings) as server:
        address = server.http_url.split(":")[0], int(server.http_url.split(":")[1])
        with (
            socket.create_connection(address, timeout=5) as idle,
            socket.create_connection(address, timeout=5) as busy,
            socket.create_connection(address, timeout=5) as body,
        ):
            started = time.perf_counter()
            for s in (idle, busy):
                s.sendall(live)
                assert s.recv(1024).startswith(b"HTTP/1.1 200")
            body.sendall(
                b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n{"
            )
            # a connection that keeps asking stays open past every timeout (the time passing
            # is the behaviour; its 0.1 s pace stays far under the 1.5 s keep-alive timeout)
            while time.perf_counter() - started < 4.0:
                busy.sendall(live)
                assert busy.recv(1024).startswith(b"HTTP/1.1 200")
                time.sleep(0.1)
            assert until(lambda: closed(idle), timeout=10)
            assert until(lambda: closed(body), timeout=10)
            assert not closed(busy)
            busy.sendall(live)
            assert busy.recv(1024).startswith(b"HTTP/1.1 200")


def test_a_batched_request_whose_client_hung_up_does_not_run(tmp_path):
    """A request queued behind a running batch whose client closes its connection is
    dropped before it runs (counted as a 499), and the server goes on answering."""
    import socket
    import threading
    import urllib.request

    import numpy as np
    from doubler_model import Doubler, binary_body, write_doubler_repository
    from polling import until
    from prometheus_client.parser import text_string_to_metric_families

    from tierserve.server.app import BackgroundServer
    from tierserve.server.servables import RankingServable
    from tierserve.server.settings import Settings

    class Gate(Doubler):
        running = threading.Event()
        release = threading.Event()  # the test lets the first batch end
        rows: list[int] = []

        def predict_batch(self, batch):
            self.rows.append(batch.batch_size)
            self.running.set()
            assert self.release.wait(60)
            return super().predict_batch(batch)

    def request(rows: int) -> bytes:
        body, header_length = binary_body(
            np.ones((rows, 3), np.float32), np.ones((rows, 2), np.int64)
        )
        return (
            b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
            b"Inference-Header-Content-Length: %d\r\n\r\n" % (len(body), header_length)
        ) + body

    def status(s: socket.socket) -> bytes:
        return s.recv(65536).split(b"\r\n", 1)[0]

    model = Gate()
    settings = Settings.build(
        model_repository=write_doubler_repository(tmp_path), http_port=0, grpc_port=None,
        poll_interval_s=0,
    )  # fmt: skip
    loader = lambda n, v, d, c: RankingServable(n, v, model)  # noqa: E731
    with BackgroundServer(settings, loader) as server:
        address = server.http_url.split(":")[0], int(server.http_url.split(":")[1])
        batcher = server.plane.repository.entries["m"].handle.extras["batcher"]
        with socket.create_connection(address, timeout=10) as first:
            first.sendall(request(16))  # a whole batch: it runs alone
            assert model.running.wait(10)
            with socket.create_connection(address, timeout=10) as gone:
                gone.sendall(request(2))  # queued behind the first ...
                assert until(lambda: batcher.queued == 1, timeout=30)
            # ... and its client gone before that batch is done
            assert until(lambda: batcher.waiting() == 0, timeout=30)
            model.release.set()
            assert status(first) == b"HTTP/1.1 200 OK"
        with socket.create_connection(address, timeout=10) as after:
            after.sendall(request(4))
            assert status(after) == b"HTTP/1.1 200 OK"
        metrics = urllib.request.urlopen(f"http://{server.http_url}/metrics", timeout=10).read()
    assert model.rows == [16, 4]
    hung_up = [
        s.value for f in text_string_to_metric_families(metrics.decode())
        for s in f.samples
        if s.name == "tierserve_request_errors_total" and s.labels.get("status") == "499"
    ]  # fmt: skip
    assert hung_up == [1.0]
