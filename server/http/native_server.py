"""Runs the server app with HTTP on the native transport (``http_transport`` native).

What uvicorn's ``Server`` does for the Python transport, for the native one: the event loop
(uvloop or asyncio, :func:`~tierserve.server.settings.event_loop`), the app's lifespan (models,
gRPC, the
repository poller), the HTTP front end (:class:`~.native.NativeHttpServer`), and a
drain on SIGTERM or SIGINT: the HTTP transport stops accepting (after taking what waits in
its accept queue) and answers every request already sent, then the lifespan ends (the gRPC
transport drains the same way), all within ``shutdown_grace_s`` each, and ``run`` returns
(the process exits 0).  A second signal skips what is left of the drain.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading

from fastapi import FastAPI

from ..settings import Settings, event_loop
from .native import NativeHttpServer

log = logging.getLogger("tierserve.server")


class NativeServer:
    """``app`` served as the module docstring says; ``started``, ``should_exit`` and
    ``run()`` as on uvicorn's ``Server`` (the tests and the worker pool use those)."""

    def __init__(self, app: FastAPI, settings: Settings, reuse_port: bool = False) -> None:
        self.app = app
        self.settings = settings
        self.reuse_port = reuse_port
        self.started = False
        self.should_exit = False
        self.force_exit = False
        self.http: NativeHttpServer | None = None

    def handle_exit(self, sig=None, frame=None) -> None:
        if self.should_exit:
            self.force_exit = True
        self.should_exit = True

    def run(self) -> None:
        if event_loop(self.settings) == "uvloop":
            import uvloop

            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(self.serve())
        else:
            asyncio.run(self.serve())

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.handle_exit)
        settings = self.settings
        async with self.app.router.lifespan_context(self.app):
            self.http = NativeHttpServer(
                self.app, settings, self.reuse_port, self.app.state.native_runtime
            )
            await self.http.start()
            log.info("HTTP listening on %s:%d (native transport)", settings.host, self.http.port)
            self.started = True
            try:
                while not self.should_exit:
                    await asyncio.sleep(0.05)
            finally:
                grace = 0.0 if self.force_exit else settings.shutdown_grace_s
                await self.http.stop(grace, give_up=lambda: self.force_exit)
