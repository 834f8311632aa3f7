"""GatheringTransport: writes of one loop step leave in one write, in order."""

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
        await asyncio.sleep(0)
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
