"""The app factory: one FastAPI app that also runs the gRPC server on its event loop.

``create_app(settings)`` builds the data plane over a model repository (or a ``ps.json``);
its lifespan loads the models, starts the gRPC server and the repository poller, and tears
everything down again.  :func:`serve` runs it with HTTP on the native transport
(:class:`~.http.native_server.NativeServer`) or on uvicorn (``http_transport``);
:class:`BackgroundServer` runs it in a thread (tests, benchmarks, the demo).  Nothing here
reads arguments at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import gc
import logging
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import FastAPI

from tierserve.core.errors import ConfigError
from tierserve.ps.table_tag import is_valid_name

from .grpc.aio import create_grpc_server
from .grpc.native import NativeGrpcServer, check_native_transport, native_available
from .http import openapi
from .http.drain import Server
from .http.native_server import NativeServer
from .http.python import uvicorn_config
from .http.rest import build_router, install_error_handler
from .runtime import heap
from .runtime.admission import Admission, BurstTrim, make_budget
from .runtime.dataplane import DataPlane
from .runtime.metrics import ServerMetrics
from .runtime.pool_state import PooledDataPlane, PoolState, reuse_port_socket
from .runtime.repository import Loader, LoadFunction, ModelRepository
from .runtime.servables import RequestLimits
from .settings import Settings

log = logging.getLogger("tierserve.server")


def _stats_source(plane: DataPlane):
    def collect():
        for entry in list(plane.repository.entries.values()):
            handle = entry.handle
            if handle is None:
                continue
            try:
                yield {"model": entry.name, **handle.servable.stats()}
            except Exception:  # a scrape never fails because one model misbehaves
                log.exception("statistics of model %s failed", entry.name)

    return collect


def create_app(
    settings: Settings, loader: Loader | LoadFunction | None = None, pool: PoolState | None = None
) -> FastAPI:
    """The server app for ``settings``; ``loader`` builds servables (default: InferenceModel);
    ``pool``: this server is one worker of a pool (:mod:`.workers`)."""
    check_sources(settings)
    native_grpc = settings.grpc_port is not None and uses_native_grpc(settings)  # refused if absent
    native = native_grpc or uses_native_http(settings)
    budget = make_budget(settings, native)
    parts = _ServerParts(
        settings=settings,
        plane=_data_plane(settings, _default_loader(loader), pool),
        admission=Admission(budget, settings),
        runtime=_native_runtime() if native else None,
        loads=ThreadPoolExecutor(1, thread_name_prefix="tierserve-load"),
        pool=pool,
    )
    app = FastAPI(
        title="tierserve",
        summary="KServe v2 inference for CTR models with tiered embedding storage",
        lifespan=parts.lifespan,
        redirect_slashes=False,  # a route is answered as written or 404, never redirected
    )
    _set_state(app, parts)
    install_error_handler(app)
    router, app.state.infer_endpoint = build_router(
        parts.plane, settings.admin_token, settings.max_request_bytes
    )
    app.include_router(router)
    openapi.install(app)
    return app


def _default_loader(loader: Loader | LoadFunction | None) -> Loader | LoadFunction:
    if loader is not None:
        return loader
    from .runtime.loader import RepositoryLoader

    return RepositoryLoader()


def _data_plane(
    settings: Settings, loader: Loader | LoadFunction, pool: PoolState | None
) -> DataPlane:
    """The data plane over a repository of ``settings``' models, its request limits and
    metric sources set; pooled when ``pool`` is given."""
    executor = ThreadPoolExecutor(settings.threads, thread_name_prefix="tierserve-infer")
    repository = ModelRepository(
        loader, root=settings.model_repository, config_path=settings.config
    )
    metrics = ServerMetrics()
    plane_args = dict(
        dynamic_batching=settings.dynamic_batching,
        max_batch_delay_s=settings.max_batch_delay_ms / 1000.0,
        limits=RequestLimits(
            max_keys_per_request=settings.max_keys_per_request,
            max_keys_per_row=settings.max_keys_per_row,
            allow_nonfinite=settings.allow_nonfinite_inputs,
        ),
    )
    plane = (DataPlane(repository, executor, metrics, **plane_args) if pool is None
             else PooledDataPlane(repository, executor, metrics, pool=pool, **plane_args))
    metrics.add_source(_stats_source(plane))
    metrics.add_tier_source(repository.loader.tier_stats)
    if pool is not None:
        # A version commits when every worker has staged it (see server/workers.py).
        repository.before_commit = pool.wait_for_peers
    return plane


def _set_state(app: FastAPI, parts: _ServerParts) -> None:
    app.state.plane = parts.plane
    app.state.settings = parts.settings
    app.state.grpc_port = None
    app.state.freeze_heap = False  # serve() sets it: its process is the server's own
    app.state.budget = parts.admission.budget
    app.state.admission = parts.admission
    #: the tokio runtime both native transports serve on (None: neither is native)
    app.state.native_runtime = parts.runtime


@dataclasses.dataclass
class _ServerParts:
    """What one app's lifespan starts and stops: the data plane (its repository and
    inference threads), the gRPC front end, the repository poller, the pool reporter and the
    budget trimmer."""

    settings: Settings
    plane: DataPlane
    admission: Admission
    runtime: Any
    loads: ThreadPoolExecutor
    pool: PoolState | None

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI):
        loop = asyncio.get_running_loop()
        await self._load_models(loop)
        grpc_server = await self._start_grpc(app)
        if app.state.freeze_heap:  # the loaded models are never walked by the collector
            heap.freeze()
            self.plane.heap = heap.Refreezer(loop)
        tasks = self._background_tasks(loop)
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await self._stop(loop, grpc_server)

    async def _load_models(self, loop: asyncio.AbstractEventLoop) -> None:
        plane, repository = self.plane, self.plane.repository
        plane.loop = loop
        await loop.run_in_executor(self.loads, repository.load_all)  # each version warmed up
        # An inference thread has run each version's warm-up too (what a thread's first run
        # costs), and what loading left is collected, before the first request.
        await loop.run_in_executor(plane.executor, _warm_inference_thread, repository)
        plane.started = True

    async def _start_grpc(self, app: FastAPI):
        settings = self.settings
        if settings.grpc_port is None:
            return None
        grpc_server, port = grpc_front_end(
            self.plane, settings, self.pool is not None, self.admission, self.runtime
        )
        await grpc_server.start()
        app.state.grpc_port = port
        app.state.grpc_server = grpc_server
        log.info("gRPC listening on %s:%d (%s)", settings.host, port,
                 "native transport" if uses_native_grpc(settings) else "grpc.aio")  # fmt: skip
        return grpc_server

    def _background_tasks(self, loop: asyncio.AbstractEventLoop) -> list[asyncio.Task]:
        """The repository poller (new versions in repository mode, retries of failed loads in
        both), the pool reporter and the budget trimmer."""
        settings, plane, pool = self.settings, self.plane, self.pool

        async def poll():
            while True:
                await asyncio.sleep(settings.poll_interval_s)
                try:
                    await loop.run_in_executor(self.loads, plane.repository.poll)
                except Exception:
                    log.exception("repository poll failed")

        async def report():
            while True:
                pool.report(plane.own_ready())
                await asyncio.sleep(0.1)

        tasks = [loop.create_task(BurstTrim(self.admission.budget).run())]
        if settings.poll_interval_s > 0:
            tasks.append(loop.create_task(poll()))
        if pool is not None:
            tasks.append(loop.create_task(report()))
        return tasks

    async def _stop(self, loop: asyncio.AbstractEventLoop, grpc_server) -> None:
        plane, repository = self.plane, self.plane.repository
        if self.pool is not None:
            self.pool.report(False)
        if plane.heap is not None:
            plane.heap.close()
        if grpc_server is not None:
            await grpc_server.stop(grace=self.settings.shutdown_grace_s)
        if self.runtime is not None:
            self.runtime.close()
        await plane.close()
        repository.close()
        await loop.run_in_executor(self.loads, repository.loader.close)
        plane.executor.shutdown(wait=False, cancel_futures=True)
        self.loads.shutdown(wait=False, cancel_futures=True)


def _warm_inference_thread(repository: ModelRepository) -> None:
    for entry in list(repository.entries.values()):
        if entry.handle is not None:
            try:
                entry.handle.servable.warm_up()
            except Exception:  # it warmed up at load already; a request will say what fails
                log.exception("model %s: warm-up on an inference thread failed", entry.name)
    gc.collect()


def _native_runtime() -> Any:
    """The tokio runtime the native transports of this process share (one thread)."""
    from tierserve_native import Runtime

    return Runtime(1)


def grpc_front_end(
    plane: DataPlane,
    settings: Settings,
    reuse_port: bool,
    admission: Admission,
    runtime: Any = None,
):
    """The unstarted gRPC server ``settings.grpc_transport`` asks for, and its port; calls
    take their room from ``admission``'s budget; the native one serves on ``runtime``."""
    if uses_native_grpc(settings):
        server = NativeGrpcServer(
            plane, settings.host, settings.grpc_port or 0, settings.admin_token,
            settings.max_request_bytes, reuse_port=reuse_port, budget=admission.budget,
            settings=settings, runtime=runtime,
        )  # fmt: skip
        return server, server.port
    return create_grpc_server(
        plane,
        f"{settings.host}:{settings.grpc_port}",
        settings.admin_token,
        settings.max_request_bytes,
        reuse_port=reuse_port,
        settings=settings,
        admission=admission,
    )


def uses_native_grpc(settings: Settings) -> bool:
    """Whether gRPC goes over the native transport; :class:`ConfigError` naming
    ``grpc_transport`` when it must and is not installed."""
    if settings.grpc_transport == "python":
        return False
    if settings.grpc_transport == "native" and not native_available():
        check_native_transport()
    return native_available()


def uses_native_http(settings: Settings) -> bool:
    """Whether HTTP goes over the native transport; :class:`ConfigError` naming
    ``http_transport`` when it must and is not installed."""
    if settings.http_transport == "python":
        return False
    if settings.http_transport == "native" and not native_available():
        from .http.native import check_native_transport as check_http

        check_http()
    return native_available()


def check_sources(settings: Settings) -> None:
    """Refuse to serve nothing: the repository folder must exist and hold a model folder,
    the ``--config`` file must exist (:class:`ConfigError` naming what is wrong)."""
    if settings.model_repository is None and settings.config is None:
        raise ConfigError("the server needs --model-repository DIR or --config ps.json")
    if settings.config is not None and not settings.config.is_file():
        raise ConfigError(f"--config {settings.config}: no such file")
    root = settings.model_repository
    if root is not None:
        if not root.is_dir():
            raise ConfigError(f"--model-repository {root}: no such folder")
        if not any(p.is_dir() and is_valid_name(p.name) for p in root.iterdir()):
            raise ConfigError(
                f"--model-repository {root} holds no model: expected <model>/<version>/ "
                "folders beside a ps.json"
            )


def serve(
    settings: Settings, loader: Loader | LoadFunction | None = None, pool: PoolState | None = None
) -> None:
    """Run the server in the foreground until interrupted (SIGTERM and SIGINT drain: requests
    in flight get ``shutdown_grace_s`` to finish); ``pool``: as one worker of a pool, on a
    port the other workers share."""
    # The event loop shares the GIL with the inference and gRPC threads; a shorter switch
    # interval (default 5 ms) keeps a request from waiting that long for it.
    sys.setswitchinterval(0.0005)
    if settings.malloc_tuning:
        from .runtime.allocator import tune_malloc

        tune_malloc()
    hugepages_setting(settings)
    check_sources(settings)
    if pool is None:
        check_ports(settings)
    app = create_app(settings, loader, pool)
    app.state.freeze_heap = True
    if uses_native_http(settings):
        NativeServer(app, settings, reuse_port=pool is not None).run()
        return
    server = Server(uvicorn_config(app, settings, settings.log_level))
    if pool is None:
        server.run()
    else:
        server.run(sockets=[reuse_port_socket(settings.host, settings.http_port)])


def check_ports(settings: Settings) -> None:
    """Refuse to start when the HTTP or gRPC port cannot be listened on (in use, or not
    allowed), before any model loads: :class:`ConfigError` naming the port."""
    for what, port in (("--http-port", settings.http_port), ("--grpc-port", settings.grpc_port)):
        if not port:
            continue
        try:
            infos = socket.getaddrinfo(settings.host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise ConfigError(f"--host {settings.host}: {exc.strerror}") from None
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                raise ConfigError(
                    f"{what} {port}: cannot listen on {settings.host}:{port}: {exc.strerror}"
                    + (" (another server runs there?)" if exc.errno == errno.EADDRINUSE else "")
                ) from None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def with_free_ports(settings: Settings) -> Settings:
    """``settings`` with a free port wherever its HTTP or gRPC port is 0."""
    updates = {}
    if settings.http_port == 0:
        updates["http_port"] = free_port(settings.host)
    if settings.grpc_port == 0:
        updates["grpc_port"] = free_port(settings.host)
    return settings.model_copy(update=updates)


def hugepages_setting(settings: Settings) -> None:
    """Opt the process out of transparent huge pages, or in with ``transparent_hugepages``
    (see :func:`~.runtime.allocator.disable_transparent_hugepages`)."""
    from .runtime.allocator import disable_transparent_hugepages

    if not disable_transparent_hugepages(not settings.transparent_hugepages):
        log.info("transparent huge pages: prctl is not available; the kernel's default holds")


class BackgroundServer:
    """The server running in a daemon thread, for tests, benchmarks and the demo.

    ``with BackgroundServer(settings) as server: ...`` waits until it answers, and exposes
    ``http_url`` (``host:port``), ``grpc_url`` and ``plane``.  Port 0 picks free ports.
    Process-wide settings apply to the hosting process: ``transparent_hugepages``.
    """

    def __init__(self, settings: Settings, loader: Loader | LoadFunction | None = None) -> None:
        self.settings = with_free_ports(settings)
        hugepages_setting(self.settings)  # the hosting process is the server's, as in serve()
        self.app = create_app(self.settings, loader)
        self.plane: DataPlane = self.app.state.plane
        if uses_native_http(self.settings):
            self._server: Any = NativeServer(self.app, self.settings)
        else:
            self._server = Server(uvicorn_config(self.app, self.settings, "warning"))
        self._thread = threading.Thread(target=self._server.run, daemon=True, name="tierserve")

    @property
    def http_url(self) -> str:
        return f"{self.settings.host}:{self.settings.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.settings.host}:{self.settings.grpc_port}"

    def start(self, timeout: float = 60.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start; see its log")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
