"""Redis standalone and Redis Cluster (masters only, or masters with replicas), from Debian's
``redis-server``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

from .install import ensure_command, run_checked
from .ports import HOST, free_port, free_ports
from .process import ServiceError, ServiceProcess

START_TIMEOUT = 15.0
CLUSTER_TIMEOUT = 60.0
CLUSTER_SLOTS = 16384


def ensure_redis() -> None:
    """Install Debian's redis-server (which brings redis-cli) when it is missing."""
    ensure_command("redis-server", "redis-server")
    ensure_command("redis-cli", "redis-tools")


class RedisServer:
    """One ``redis-server`` on 127.0.0.1, its data in ``workdir``.

    By default it writes nothing to disk (``save=""``, ``appendonly=False``). For a test of
    persistence across a restart, pass ``appendonly=True`` (or RDB save points such as
    ``save="3600 1"``): ``stop()`` is a clean shutdown, which saves, and ``start()`` starts
    again on the same port from the same directory. ``kill()`` is a crash (SIGKILL).
    """

    def __init__(
        self,
        workdir: Path,
        log_path: Path,
        *,
        port: int | None = None,
        appendonly: bool = False,
        save: str = "",
        extra_args: Sequence[str] = (),
        name: str = "redis",
    ) -> None:
        self.host = HOST
        self.port = port if port is not None else free_port()
        self.workdir = workdir
        self.appendonly = appendonly
        self.save = save
        self.process = ServiceProcess(name, self._argv(extra_args), log_path, cwd=workdir)

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        return f"redis://{self.host}:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def _argv(self, extra_args: Sequence[str]) -> list[str]:
        return [
            "redis-server",
            "--bind", self.host,
            "--port", str(self.port),
            "--dir", str(self.workdir),
            "--save", self.save,
            "--appendonly", "yes" if self.appendonly else "no",
            "--protected-mode", "yes",
            "--daemonize", "no",
            *extra_args,
        ]  # fmt: skip

    def client(self, **kwargs):
        """A ``redis.Redis`` client for this server (keyword arguments go to it)."""
        import redis

        return redis.Redis(host=self.host, port=self.port, **kwargs)

    def ping(self) -> bool:
        """True when the server answers PING (not while it is still loading its data)."""
        with self.client(socket_timeout=1, socket_connect_timeout=1) as client:
            return bool(client.ping())

    def start(self, timeout: float = START_TIMEOUT) -> float:
        """Start the server and wait until it answers PING; return the seconds that took."""
        started = time.monotonic()
        self.process.start()
        try:
            self.process.wait_until(self.ping, "answering PING", timeout)
        except BaseException:
            self.process.kill()
            raise
        return time.monotonic() - started

    def stop(self) -> None:
        """Shut down cleanly (SIGTERM: Redis saves first when persistence is on)."""
        self.process.stop()

    def kill(self) -> None:
        """SIGKILL the server: it loses whatever it had not yet written to disk."""
        self.process.kill()

    @property
    def running(self) -> bool:
        return self.process.running


class RedisCluster:
    """Redis Cluster nodes joined with ``redis-cli --cluster create``: ``len(workdirs) / (1 +
    replicas)`` masters (at least three), each with ``replicas`` replicas (default none);
    redis-cli decides which node is which (ask ``role(i)``).

    ``cluster-node-timeout`` is low and ``cluster-require-full-coverage`` is off, so when one
    node dies the others go on serving their own slots, and a dead master's replica is
    promoted (failover) about ``node_timeout_ms`` plus one second later. ``kill_node(i)``
    SIGKILLs node ``i``; ``restart_node(i)`` starts it again on the same port from the same
    directory (its ``nodes.conf`` brings it back into the cluster, a dead master as a replica
    of its promoted one) and waits until every node says cluster_state:ok with all slots
    served again. Without ``appendonly=True`` a restarted node comes back empty.
    ``role(i)``, ``replicas_of(i)`` and ``wait_replicated()`` tell who serves what and make
    writes reach the replicas, for failover tests.
    """

    def __init__(
        self,
        workdirs: Sequence[Path],
        log_paths: Sequence[Path],
        *,
        node_timeout_ms: int = 2000,
        appendonly: bool = False,
        replicas: int = 0,
    ) -> None:
        size = len(workdirs)
        if replicas < 0 or size % (1 + replicas) or size // (1 + replicas) < 3:
            raise ValueError(
                f"{size} nodes cannot make three or more masters with {replicas} replicas each"
            )
        self.replicas = replicas
        ports = free_ports(2 * size)  # a client port and a cluster bus port per node
        self._nodes = [
            RedisServer(
                workdir,
                log_path,
                port=ports[i],
                appendonly=appendonly,
                name=f"redis cluster node {i}",
                extra_args=[
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-port", str(ports[size + i]),
                    "--cluster-node-timeout", str(node_timeout_ms),
                    "--cluster-require-full-coverage", "no",
                ],
            )  # fmt: skip
            for i, (workdir, log_path) in enumerate(zip(workdirs, log_paths, strict=True))
        ]

    @property
    def nodes(self) -> list[str]:
        """``["127.0.0.1:P1", "127.0.0.1:P2", ...]``, in node order."""
        return [node.address for node in self._nodes]

    @property
    def addresses(self) -> str:
        """``"127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"`` (the VDB ``address`` field's format)."""
        return ",".join(self.nodes)

    @property
    def servers(self) -> list[RedisServer]:
        """The node processes, in node order."""
        return list(self._nodes)

    def client(self, **kwargs):
        """A ``redis.cluster.RedisCluster`` client for this cluster."""
        from redis.cluster import ClusterNode
        from redis.cluster import RedisCluster as ClusterClient

        startup_nodes = [ClusterNode(node.host, node.port) for node in self._nodes]
        return ClusterClient(startup_nodes=startup_nodes, **kwargs)

    def start(self, timeout: float = CLUSTER_TIMEOUT) -> float:
        """Start the nodes, create the cluster, wait until it is ok; return the seconds taken."""
        started = time.monotonic()
        try:
            for node in self._nodes:
                node.start()
            if not self._created():
                run_checked(
                    ["redis-cli", "--cluster", "create", *self.nodes,
                     "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                    "redis-cli --cluster create",
                    timeout=timeout,
                )  # fmt: skip
            self.wait_ok(timeout)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - started

    def _created(self) -> bool:
        info = self._cluster_info(self._nodes[0])
        return int(info.get("cluster_slots_assigned", 0)) == CLUSTER_SLOTS

    @staticmethod
    def _cluster_info(node: RedisServer) -> dict[str, str]:
        with node.client(socket_timeout=1, socket_connect_timeout=1) as client:
            return {key: str(value) for key, value in client.cluster("INFO").items()}

    def _all_ok(self) -> bool:
        for node in self._nodes:
            info = self._cluster_info(node)
            if info.get("cluster_state") != "ok":
                return False
            if int(info.get("cluster_slots_ok", 0)) != CLUSTER_SLOTS:
                return False
            if int(info.get("cluster_known_nodes", 0)) != len(self._nodes):
                return False
        for index in range(len(self._nodes)):
            role = self.role_reply(index)
            if role[0] == "slave" and role[3] != "connected":  # a replica still syncing
                return False
        return True

    def role_reply(self, index: int) -> list:
        """Node ``index``'s ``ROLE`` reply, strings decoded."""

        def text(value):
            if isinstance(value, bytes):
                return value.decode()
            if isinstance(value, list):
                return [text(v) for v in value]
            return value

        with self._nodes[index].client(socket_timeout=1, socket_connect_timeout=1) as client:
            return text(client.execute_command("ROLE"))

    def role(self, index: int) -> str:
        """``master`` or ``slave``: what node ``index`` says it is now."""
        return self.role_reply(index)[0]

    def replicas_of(self, index: int) -> list[int]:
        """The nodes (indexes) that replicate master ``index``, as it says now."""
        reply = self.role_reply(index)
        if reply[0] != "master":
            raise ServiceError(f"node {index} is a {reply[0]}, not a master")
        ports = [node.port for node in self._nodes]
        return [ports.index(int(port)) for _host, port, _offset in reply[2]]

    def wait_replicated(self, timeout: float = 10.0) -> None:
        """Wait until every running master's replicas acknowledged all its writes so far
        (``WAIT``), so that a replica promoted after this holds them."""
        for index, node in enumerate(self._nodes):
            if not node.running or self.role(index) != "master" or not self.replicas:
                continue
            with node.client(socket_timeout=timeout + 1) as client:
                acked = int(client.execute_command("WAIT", self.replicas, int(timeout * 1000)))
            if acked < self.replicas:
                raise ServiceError(
                    f"node {index}: {acked} of {self.replicas} replicas acknowledged its "
                    f"writes within {timeout} s"
                )

    def wait_ok(self, timeout: float = CLUSTER_TIMEOUT) -> float:
        """Wait until every node reports cluster_state:ok and serves all 16384 slots."""
        for node in self._nodes:
            if not node.running:
                raise ServiceError(f"{node.process.name} is not running (kill_node without restart?)")
        return self._nodes[0].process.wait_until(self._all_ok, "a healthy cluster", timeout)

    def kill_node(self, index: int) -> None:
        """SIGKILL node ``index``; the others keep serving their slots."""
        self._nodes[index].kill()

    def restart_node(self, index: int, timeout: float = CLUSTER_TIMEOUT) -> float:
        """Start node ``index`` again (same port, same directory) and wait for a healthy cluster."""
        started = time.monotonic()
        self._nodes[index].start()
        self.wait_ok(timeout)
        return time.monotonic() - started

    def heal(self, timeout: float = CLUSTER_TIMEOUT) -> None:
        """Restart every node that is not running, then wait for a healthy cluster."""
        for node in self._nodes:
            if not node.running:
                node.start()
        self.wait_ok(timeout)

    def node_index_for_key(self, key: bytes | str) -> int:
        """Which node (index into ``nodes``) serves ``key``'s hash slot, as the cluster says now."""
        from redis.crc import key_slot

        encoded = key.encode() if isinstance(key, str) else key
        slot = key_slot(encoded)
        ports = [node.port for node in self._nodes]
        for node in self._nodes:
            if not node.running:
                continue
            with node.client(socket_timeout=1) as client:
                for start, end, primary, *_replicas in client.execute_command("CLUSTER SLOTS"):
                    if start <= slot <= end:
                        return ports.index(int(primary[1]))
        raise ServiceError(f"no running node knows who serves slot {slot}")

    def stop(self) -> None:
        """Stop every node."""
        for node in self._nodes:
            node.stop()
