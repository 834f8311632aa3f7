"""Suite-wide setup: real services as lazy, session-scoped fixtures (code in tests/services/).

A service is installed when missing and started only when a selected test asks for its fixture;
it stops at the end of the session. Fixtures:

- ``redis_server``: a standalone Redis (``.host``, ``.port``, ``.url``, ``.client()``,
  ``.stop()``, ``.start()``, ``.kill()``), shared by the session; nothing is written to disk.
- ``redis_server_factory(appendonly=False, save="")``: starts another standalone Redis, for
  tests that restart it or need persistence; stopped at the end of the session.
- ``redis_cluster``: three Redis Cluster masters (``.nodes``, ``.addresses``, ``.client()``,
  ``.kill_node(i)``, ``.restart_node(i)``, ``.heal()``, ``.node_index_for_key(key)``).
- ``redis_cluster_factory(masters=3, replicas=1, node_timeout_ms=1000)``: starts a Redis
  Cluster of the test's own (``.role(i)``, ``.replicas_of(i)``, ``.wait_replicated()`` for
  failover tests); stopped at the end of the session.
- ``kafka_broker``: Apache Kafka 4.x, broker and controller in one process (``.bootstrap``,
  ``.stop()``, ``.start()``, ``.kill()``).
- ``kafka_broker_factory()``: starts a broker of the test's own, for tests that restart it
  or delete its topics; stopped at the end of the session.
- ``triton_server_factory(model_repository, model_control_mode="none", load_models=())``:
  starts a tritonserver (``.http_url``, ``.grpc_url``, ``.stop()``); see tests/services/triton.py
  for how a Python-backend model finds the virtual environment.

The session-wide services are shared: a test that kills or stops one brings it back before it
ends (``finally:``). Tests that use a fixture get its marker (redis, redis_cluster, kafka,
triton), so ``-m "not kafka"`` deselects them. Each service logs to a file in a temporary
folder; when the session fails the logs are copied to .pytest-service-logs/ in the repository.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:  # so that `import services` finds tests/services
    sys.path.insert(0, str(TESTS_DIR))

from http_transports import each_http_transport  # noqa: E402, F401 (a fixture)
from services import install  # noqa: E402
from services.kafka import KafkaBroker, ensure_kafka  # noqa: E402
from services.redis import RedisCluster, RedisServer, ensure_redis  # noqa: E402
from services.triton import TritonServer, ensure_tritonserver  # noqa: E402
from services.workspace import Workspace  # noqa: E402

SERVICE_LOGS = ".pytest-service-logs"
FIXTURE_MARKERS = {
    "redis_server": "redis",
    "redis_server_factory": "redis",
    "redis_cluster": "redis_cluster",
    "redis_cluster_factory": "redis_cluster",
    "kafka_broker": "kafka",
    "kafka_broker_factory": "kafka",
    "triton_server_factory": "triton",
}

_workspace_key = pytest.StashKey[Workspace]()
_kept_logs_key = pytest.StashKey[Path]()
T = TypeVar("T")


# --- hooks ---------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    """Let install and startup messages through pytest's output capture."""

    def announce(message: str) -> None:
        # Looked up here: the terminal reporter registers after conftest's pytest_configure.
        capture = config.pluginmanager.getplugin("capturemanager")
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if capture is None or reporter is None:
            print(message, file=sys.stderr, flush=True)
            return
        with capture.global_and_fixture_disabled():
            reporter.write_line(message)

    install.set_announcer(announce)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with the services its fixtures start."""
    for item in items:
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """After every fixture is torn down: keep the service logs when the session failed."""
    workspace = session.config.stash.get(_workspace_key, None)
    if workspace is None:
        return
    failed = exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED)
    kept = workspace.finish(session.config.rootpath / SERVICE_LOGS if failed else None)
    if kept is not None:
        session.config.stash[_kept_logs_key] = kept


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    """One line of service timings, and where the logs are when they were kept."""
    workspace = config.stash.get(_workspace_key, None)
    if workspace is None:
        return
    # Install steps that found everything cached take no time and are left out.
    timings = [
        f"{what} {seconds:.2f}s"
        for what, seconds in workspace.timings
        if seconds >= 0.1 or not what.endswith(" install")
    ]
    if timings:
        terminalreporter.write_line(f"services: {', '.join(timings)}")
    kept = config.stash.get(_kept_logs_key, None)
    if kept is not None:
        terminalreporter.write_line(f"service logs kept in {kept}", yellow=True, bold=True)


# --- fixtures ------------------------------------------------------------------------------


def _timed(workspace: Workspace, what: str, step: Callable[[], T]) -> T:
    started = time.monotonic()
    result = step()
    workspace.record(what, time.monotonic() - started)
    return result


@pytest.fixture(scope="session")
def service_workspace(pytestconfig: pytest.Config) -> Workspace:
    """The session's temporary folder for service data and logs."""
    workspace = Workspace()
    pytestconfig.stash[_workspace_key] = workspace
    return workspace


@pytest.fixture(scope="session")
def redis_server_factory(service_workspace: Workspace) -> Iterator[Callable[..., RedisServer]]:
    """``start(appendonly=False, save="")`` starts a new standalone Redis and returns it."""
    _timed(service_workspace, "redis install", ensure_redis)
    with contextlib.ExitStack() as cleanup:

        def start(*, appendonly: bool = False, save: str = "") -> RedisServer:
            server = RedisServer(
                service_workspace.data_dir("redis"),
                service_workspace.log_path("redis"),
                appendonly=appendonly,
                save=save,
            )
            cleanup.callback(server.stop)
            _timed(service_workspace, "redis start", server.start)
            return server

        yield start


@pytest.fixture(scope="session")
def redis_server(redis_server_factory: Callable[..., RedisServer]) -> RedisServer:
    """A standalone Redis shared by the session; it writes nothing to disk."""
    return redis_server_factory()


@pytest.fixture(scope="session")
def redis_cluster(service_workspace: Workspace) -> Iterator[RedisCluster]:
    """A three-master Redis Cluster (no replicas) shared by the session."""
    _timed(service_workspace, "redis install", ensure_redis)
    cluster = RedisCluster(
        [service_workspace.data_dir(f"redis-cluster-{i}") for i in range(3)],
        [service_workspace.log_path(f"redis-cluster-{i}") for i in range(3)],
    )
    try:
        _timed(service_workspace, "redis cluster start", cluster.start)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def redis_cluster_factory(service_workspace: Workspace) -> Iterator[Callable[..., RedisCluster]]:
    """``start(masters=3, replicas=1, node_timeout_ms=1000)`` starts a new Redis Cluster (for
    tests that kill its nodes: a master's replica is promoted about two seconds after)."""
    _timed(service_workspace, "redis install", ensure_redis)
    with contextlib.ExitStack() as cleanup:

        def start(*, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000):
            size = masters * (1 + replicas)
            cluster = RedisCluster(
                [service_workspace.data_dir(f"redis-cluster-r{i}") for i in range(size)],
                [service_workspace.log_path(f"redis-cluster-r{i}") for i in range(size)],
                node_timeout_ms=node_timeout_ms,
                replicas=replicas,
            )
            cleanup.callback(cluster.stop)
            _timed(service_workspace, "redis cluster start", cluster.start)
            return cluster

        yield start


@pytest.fixture(scope="session")
def kafka_broker(service_workspace: Workspace) -> Iterator[KafkaBroker]:
    """An Apache Kafka 4.x broker (KRaft, combined mode) shared by the session."""
    kafka = _timed(service_workspace, "kafka install", ensure_kafka)
    broker = KafkaBroker(kafka, service_workspace.data_dir("kafka"), service_workspace.log_path("kafka"))
    try:
        _timed(service_workspace, "kafka start", broker.start)
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_broker_factory(service_workspace: Workspace) -> Iterator[Callable[[], KafkaBroker]]:
    """``start()`` starts another Kafka broker (its own ports and log directory)."""
    kafka = _timed(service_workspace, "kafka install", ensure_kafka)
    with contextlib.ExitStack() as cleanup:

        def start() -> KafkaBroker:
            broker = KafkaBroker(
                kafka, service_workspace.data_dir("kafka"), service_workspace.log_path("kafka")
            )
            cleanup.callback(broker.stop)
            _timed(service_workspace, "kafka start", broker.start)
            return broker

        yield start


@pytest.fixture(scope="session")
def triton_server_factory(service_workspace: Workspace) -> Iterator[Callable[..., TritonServer]]:
    """``start(model_repository, model_control_mode="none", load_models=(), extra_args=(),
    cwd=None, env=None)``.

    Starts a tritonserver on the given model repository, waits until it is ready and returns
    it; ``stop()`` it when done, or it stops at the end of the session.
    """
    triton = _timed(service_workspace, "tritonserver install", ensure_tritonserver)
    with contextlib.ExitStack() as cleanup:

        def start(
            model_repository: Path,
            *,
            model_control_mode: str = "none",
            load_models: Sequence[str] = (),
            extra_args: Sequence[str] = (),
            cwd: Path | None = None,
            env: dict[str, str] | None = None,
        ) -> TritonServer:
            server = TritonServer(
                triton,
                model_repository,
                service_workspace.log_path("tritonserver"),
                model_control_mode=model_control_mode,
                load_models=load_models,
                extra_args=extra_args,
                cwd=cwd,
                env=env,
            )
            cleanup.callback(server.stop)
            _timed(service_workspace, "tritonserver start", server.start)
            return server

        yield start
