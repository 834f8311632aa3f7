"""Worker processes: ``tierserve serve --workers N`` runs N servers on the same ports.

Each worker is a whole server (its own event loop, batcher, inference threads and models) in
a process of its own, so N workers use N cores where one process is held to about one by the
GIL.  All of them listen on the same HTTP and gRPC ports (``SO_REUSEPORT``: the kernel spreads
new connections over the workers).  The parent process loads nothing: it starts the workers,
starts a new one with a log line when one exits, and on SIGTERM or SIGINT asks every worker
to drain (requests in flight finish, within ``shutdown_grace_s``), then kills what is left.

Each worker runs on its own share of the cores this process may use (CPU affinity, set
before the worker starts any thread; ``pin_workers``, ``--no-pin-workers`` to leave the
scheduler free): the allowed cores split into equal disjoint shares, one core each when there
are as many workers as cores (the default), round robin when there are more workers.  Together
the shares cover every allowed core.  Measured on 2 cores with 64 clients, two pinned workers
served 1.16-1.34x (HTTP) and 1.06-1.18x (gRPC) the rows/s of two unpinned ones: a worker's event loop,
inference and gRPC threads hand the GIL to each other, and on one core a hand-off is a plain
switch where across cores it is a wake-up of a thread on another core, while the other
worker's threads are moved about between the cores.

Readiness is the pool's: each worker writes whether it is ready into a shared array, the
parent clears the slot of a worker that exited, and every worker's ``/v2/health/ready`` (and
gRPC ``ServerReady``) answers ready only while every worker is.  ``/metrics`` sums requests,
errors, latency and batch sizes over the workers (prometheus-client's multiprocess mode, in a
folder the parent creates and removes); cache hit rates and tier statistics are the answering
worker's own.

Tables: with an in-process tier (``hash_map``, ``parallel_hash_map``) each worker loads its
own copy; with ``multi_process_hash_map`` (:mod:`tierserve.ps.shm_hash_map`) the workers share
one copy in ``/dev/shm`` (the first to load a version's table fills it, the others attach;
one worker applies each Kafka update to it and every worker's cache hears of it; a table
stays while any worker uses it).  Dense weights are read into a file of ``/dev/shm`` per
version that every worker maps (:mod:`tierserve.model.served_weights`; the parent removes
what is left when it stops), never mapped from the model's own files.  Each worker polls the
repository on its own and stages a new version when it sees it; a staged version then waits (:meth:`PoolState.wait_for_peers`)
until every running worker has staged it too, and the workers commit it together, within
milliseconds of each other (after :data:`~.runtime.pool_state.COMMIT_BARRIER_S` a worker commits
alone, with a
warning naming the workers it waited for).  Every answer is wholly one version's.  A
repository load or unload request reaches the one worker that answers it.  Tiers that the workers would share and write otherwise cannot be
served by several workers yet: a writable RocksDB opens in one process only, and a Redis tier
would be loaded, and its replaced tables dropped, by each worker on its own under the same
names.  With such a ``ps.json`` the default is one worker, and ``--workers`` above one is
refused with a message naming the tier.

Startup: the parent reads ``ps.json`` once, before any worker starts (:func:`check_config`),
so a configuration error is one line naming the file and the field, and exit status 2, never
a worker that fails and is started again.  A worker that dies later is started again at once
when it had run a while (:data:`QUICK_EXIT_S`), else after a jittered backoff
(:data:`RESTART_BACKOFF`); after :data:`RESTART_LIMIT` such quick exits in a row the pool
stops every worker and exits with status 1.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from multiprocessing.connection import wait
from pathlib import Path

from tierserve.core.errors import ConfigError
from tierserve.ps.config import PSConfig, load_ps_config
from tierserve.ps.retry import EqualJitterBackoff

from .runtime.pool_state import STAGED_RING, PoolState
from .settings import Settings

log = logging.getLogger("tierserve.server.workers")

#: A worker that exits within this many seconds of starting is restarted after a backoff:
#: 1, 2, 4 ... s up to RESTART_CAP_S, with equal jitter (workers that die together do not
#: come back together).
QUICK_EXIT_S = 10.0
RESTART_CAP_S = 30.0
RESTART_BACKOFF = EqualJitterBackoff(cap=RESTART_CAP_S, base=1.0)
#: Quick exits in a row of one worker after which the pool gives up.
RESTART_LIMIT = 5


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def ps_json_path(settings: Settings) -> Path | None:
    """The ``ps.json`` the server reads: ``--config``, or the repository's."""
    if settings.config is not None:
        return Path(settings.config)
    return Path(settings.model_repository) / "ps.json" if settings.model_repository else None


def check_config(settings: Settings) -> PSConfig | None:
    """Read ``settings``' ``ps.json`` once, here, before any worker starts.

    Refused (:class:`ConfigError`, one line naming the file and what is wrong), because the
    server could not become ready without the file being changed: a ``ps.json`` that is
    missing, not JSON or not valid, and a repository model folder that has no entry in it.
    """
    path = ps_json_path(settings)
    if path is None:
        return None
    if not path.is_file():
        raise ConfigError(
            f"{path}: no such file; a model repository needs a ps.json beside its model "
            "folders (the tiers and each model's entry; see docs/serving.md)"
        )
    config = load_ps_config(path)
    if settings.model_repository is not None:
        from .runtime.repository import ModelRepository

        on_disk = ModelRepository(loader=None, root=settings.model_repository).model_names()
        listed = {m.model for m in config.models}
        missing = [name for name in on_disk if name not in listed]
        if missing:
            raise ConfigError(
                f"{path}: no entry for model folder{'s' if len(missing) > 1 else ''} "
                f"{', '.join(missing)} (it lists {', '.join(sorted(listed)) or 'no model'}); "
                "add an entry to \"models\" or move the folder out of the repository"
            )
    return config


def unshareable(config: PSConfig | None) -> str | None:
    """Why the tiers of ``config`` cannot be served by several workers (None: they can)."""
    if config is None:
        return None
    volatile = _type_name(config.volatile_db)
    if volatile in ("redis", "redis_cluster"):
        return (
            f"volatile_db {volatile}: every worker would load its tables and drop replaced "
            "ones in the shared Redis on its own"
        )
    persistent = config.persistent_db
    if _type_name(persistent) == "rocks_db" and not persistent.read_only:
        return (
            f"persistent_db rocks_db at {persistent.path} opens for writing in one process only "
            '(set "read_only": true in ps.json to share it)'
        )
    return None


def _type_name(tier_config) -> str | None:
    kind = getattr(tier_config, "type", None)
    return getattr(kind, "name", kind)  # DatabaseType_t members, or plain strings


def worker_count(settings: Settings, config: PSConfig | None = None) -> int:
    """How many workers ``settings`` asks for; :class:`ConfigError` when the tiers of its
    ``ps.json`` (``config``; None: read it here) cannot be shared by that many (see the module
    docstring)."""
    if config is None:
        path = ps_json_path(settings)
        with contextlib.suppress(ConfigError):
            config = load_ps_config(path) if path is not None and path.is_file() else None
    why = unshareable(config)
    if settings.workers is not None:
        if settings.workers > 1 and why is not None:
            raise ConfigError(f"--workers {settings.workers}: {why}; use --workers 1")
        return settings.workers
    wanted = min(cores(), settings.max_workers)
    if wanted > 1 and why is not None:
        log.info("one worker process: %s", why)
        return 1
    return wanted


def run_server(settings: Settings) -> int:
    """Serve ``settings`` in the foreground: in this process for one worker, else with a
    pool of worker processes (see the module docstring); the exit status."""
    from .app import check_ports, check_sources, serve

    check_sources(settings)
    config = check_config(settings)
    check_ports(settings)
    count = worker_count(settings, config)
    if count == 1:
        serve(settings)
        return 0
    return WorkerPool(settings, count).run()


def allowed_cores() -> list[int]:
    """The cores this process may run on, in order (all of ``os.cpu_count()`` where the
    platform has no affinity)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def core_shares(count: int, cores: list[int]) -> list[set[int]]:
    """The cores each of ``count`` workers runs on: ``cores`` split into ``count`` disjoint
    shares of equal size (the first shares one core larger when they do not split evenly),
    one core each in turn when there are fewer cores than workers."""
    if count >= len(cores):
        return [{cores[i % len(cores)]} for i in range(count)]
    size, larger = divmod(len(cores), count)
    shares, start = [], 0
    for i in range(count):
        end = start + size + (1 if i < larger else 0)
        shares.append(set(cores[start:end]))
        start = end
    return shares


def pin_threads(cores: set[int]) -> None:
    """Run this process on ``cores``: its threads now (importing numpy started BLAS threads
    already) and, inheriting it, those it starts later."""
    for task in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(int(task), cores)


class WorkerPool:
    """The parent of ``count`` worker processes serving ``settings``."""

    def __init__(self, settings: Settings, count: int) -> None:
        from .app import with_free_ports

        self.settings = with_free_ports(settings)
        self.count = count
        self._ctx = multiprocessing.get_context("spawn")  # no fork after grpc or threads
        self.ready = self._ctx.RawArray("b", count)
        self.alive = self._ctx.RawArray("b", count)
        self.staged = self._ctx.RawArray("q", count * STAGED_RING)
        self.procs: list = [None] * count
        self.started_at = [0.0] * count
        self.quick_exits = [0] * count
        self.due = [0.0] * count  # when a worker that exited is started again
        self._stopping = False
        self.gave_up: str | None = None  # why the pool stopped on its own
        self.metrics_dir = Path(tempfile.mkdtemp(prefix="tierserve-metrics-"))
        self.shared_dense = f"tierserve-dense-{os.getpid()}"  # see model/served_weights.py
        self.shares: list[set[int] | None] = (
            list(core_shares(count, allowed_cores()))
            if settings.pin_workers and hasattr(os, "sched_setaffinity")  # Linux
            else [None] * count
        )

    def _start(self, index: int) -> None:
        proc = self._ctx.Process(
            target=_worker_main,
            args=(
                self.settings.model_dump_json(),
                index,
                self.ready,
                self.alive,
                self.staged,
                str(self.metrics_dir),
                self.shares[index],
            ),
            name=f"tierserve-worker-{index}",
            daemon=False,
        )
        self.staged[index * STAGED_RING : (index + 1) * STAGED_RING] = [0] * STAGED_RING
        self.alive[index] = 1
        proc.start()
        self.procs[index] = proc
        self.started_at[index] = time.monotonic()
        log.info(
            "worker %d started (pid %d%s)", index, proc.pid,
            f", cores {','.join(map(str, sorted(self.shares[index])))}"
            if self.shares[index] is not None else "",
        )  # fmt: skip

    def _on_signal(self, signum, frame) -> None:
        self._stopping = True

    def run(self) -> int:
        """Start the workers and keep them running until SIGTERM or SIGINT (exit status 0),
        or until one keeps failing to start (1)."""
        from tierserve.model.served_weights import SHARED_ENV, remove_shared

        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(self.metrics_dir)
        os.environ[SHARED_ENV] = self.shared_dense  # workers share their dense weights
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            for i in range(self.count):
                self._start(i)
            log.info(
                "%d workers serving HTTP on %s:%d%s", self.count, self.settings.host,
                self.settings.http_port,
                f" and gRPC on :{self.settings.grpc_port}" if self.settings.grpc_port else "",
            )  # fmt: skip
            while not self._stopping:
                self._watch()
        finally:
            self.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
            os.environ.pop(SHARED_ENV, None)
            shutil.rmtree(self.metrics_dir, ignore_errors=True)
            remove_shared(self.shared_dense)
        if self.gave_up is not None:
            log.error("%s", self.gave_up)
            return 1
        return 0

    def _watch(self) -> None:
        live = {p.sentinel: i for i, p in enumerate(self.procs) if p is not None}
        for sentinel in wait(list(live), timeout=0.2):
            i = live[sentinel]
            proc = self.procs[i]
            proc.join()
            self.procs[i] = None
            self.ready[i] = self.alive[i] = 0
            if self._stopping:
                continue
            quick = time.monotonic() - self.started_at[i] < QUICK_EXIT_S
            self.quick_exits[i] = self.quick_exits[i] + 1 if quick else 0
            if self.quick_exits[i] >= RESTART_LIMIT:
                self.gave_up = (
                    f"worker {i} exited {self.quick_exits[i]} times in a row within "
                    f"{QUICK_EXIT_S:.0f} s of starting (last exit code {proc.exitcode}); "
                    "stopping the server: see the worker's log above"
                )
                self._stopping = True
                continue
            delay = RESTART_BACKOFF.compute(self.quick_exits[i]) if quick else 0.0
            self.due[i] = time.monotonic() + delay
            log.warning(
                "worker %d (pid %d) exited with code %s; starting another%s", i, proc.pid,
                proc.exitcode, f" in {delay:.1f} s" if delay else "",
            )  # fmt: skip
        now = time.monotonic()
        for i, proc in enumerate(self.procs):
            if proc is None and not self._stopping and now >= self.due[i]:
                self._start(i)

    def stop(self) -> None:
        """Ask every worker to drain and exit; kill those still running after the grace
        period (plus a few seconds to close)."""
        self._stopping = True
        procs = [p for p in self.procs if p is not None]
        for proc in procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.settings.shutdown_grace_s + 5.0
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                log.warning("worker pid %d did not stop within the grace period; killed", proc.pid)
                proc.kill()
                proc.join()
        self.procs = [None] * self.count


def _die_with_parent() -> None:
    """Have the kernel send this process SIGTERM when its parent dies (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


#: The environment variable naming this replica in Kafka consumer groups (ps.kafka_groups).
REPLICA_ENV = "TIERSERVE_REPLICA_ID"


def _worker_main(
    settings_json: str,
    index: int,
    ready,
    alive,
    staged,
    metrics_dir: str,
    cores: set[int] | None = None,
) -> None:
    if cores is not None:
        pin_threads(cores)
    _die_with_parent()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
    if os.environ.get(REPLICA_ENV) and index > 0:
        # each worker's in-process tables need every update: a consumer group of its own
        # (worker 0 keeps the name given, so its groups are the ones a single process had)
        os.environ[REPLICA_ENV] = f"{os.environ[REPLICA_ENV][:190]}-w{index}"
    settings = Settings.model_validate_json(settings_json)
    from .app import serve
    from .logs import configure_logging

    configure_logging(settings.log_level, worker=index)

    with contextlib.suppress(KeyboardInterrupt):
        serve(settings, pool=PoolState(index, ready, alive, staged))
    sys.exit(0)
