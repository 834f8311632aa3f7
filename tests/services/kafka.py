"""Apache Kafka 4.x in KRaft combined mode: one JVM that is both broker and controller.

The jars come from Maven Central through ``kafka/pom.xml`` (``mvn dependency:copy-dependencies``)
into ``<cache>/kafka/libs``; ~/.m2 keeps the downloads. Three things keep a broker's startup
short on a small machine:

- the storage tool runs once per install, formatting a template log directory that each broker
  copies (a single node with a fixed node id and cluster id needs nothing else);
- the first broker that stops cleanly leaves a class-data-sharing archive
  (``-XX:ArchiveClassesAtExit``) that later brokers map (``-XX:SharedArchiveFile``);
- the JVM runs with a small heap, the serial GC and the C1 compiler only
  (``-XX:TieredStopAtLevel=1``). Set TIERSERVE_KAFKA_JAVA_OPTS to replace these options, for
  example for a throughput measurement where C2 pays off.

Internal topics get one partition and replication factor one.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from .install import (
    announce,
    cache_root,
    ensure_command,
    install_lock,
    read_marker,
    run_checked,
    write_marker,
)
from .ports import HOST, free_ports, port_open
from .process import ServiceProcess

POM = Path(__file__).resolve().parent / "kafka" / "pom.xml"
NODE_ID = 1
CLUSTER_ID = "dGllcnNlcnZlLXRlc3RzAA"  # any 16 bytes, base64url; the same for every test broker
DEFAULT_JAVA_OPTS = ("-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
START_TIMEOUT = 90.0
STOP_TIMEOUT = 30.0


@dataclass(frozen=True)
class KafkaInstall:
    """Where an installed Kafka lives."""

    home: Path  # <cache>/kafka
    java: str

    @property
    def libs(self) -> Path:
        return self.home / "libs"

    @property
    def classpath(self) -> str:
        return f"{self.libs}/*"

    @property
    def storage_template(self) -> Path:
        """A log directory formatted by the storage tool, copied by each broker."""
        return self.home / "formatted-log-dir"

    @property
    def class_archive(self) -> Path:
        """The class-data-sharing archive written by the first broker that stopped cleanly.

        Its name follows the java binary, so that another JVM (an upgrade) writes its own.
        """
        java = Path(self.java).resolve()
        stat = java.stat()
        key = hashlib.sha256(f"{java}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
        return self.home / f"broker-{key[:12]}.jsa"


def ensure_kafka() -> KafkaInstall:
    """Install Java when missing, and Kafka's jars plus a formatted log directory when missing.

    The install is redone when ``kafka/pom.xml`` changes (its hash is the marker's content).
    """
    java = ensure_command("java", "openjdk-17-jre-headless")
    install = KafkaInstall(home=cache_root() / "kafka", java=java)
    marker = install.home / ".installed"
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()
    if read_marker(marker) == digest:
        return install
    with install_lock("kafka"):
        if read_marker(marker) == digest:
            return install
        mvn = ensure_command("mvn", "maven")
        announce(f"installing Kafka jars with Maven from {POM} into {install.libs}")
        shutil.rmtree(install.home, ignore_errors=True)
        install.home.mkdir(parents=True)
        run_checked(
            [mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
             "-DincludeScope=runtime", f"-DoutputDirectory={install.libs}"],
            "resolving Kafka's jars with Maven",
            timeout=900,
        )  # fmt: skip
        _format_template(install)
        write_marker(marker, digest)
    return install


def _format_template(install: KafkaInstall) -> None:
    """Run the storage tool once into the template log directory."""
    config = install.home / "format.properties"
    # The ports are never bound: formatting records only the node id, cluster id and features.
    config.write_text(server_properties(9092, 9093, install.storage_template))
    run_checked(
        [install.java, "-cp", install.classpath, "kafka.tools.StorageTool", "format",
         "--cluster-id", CLUSTER_ID, "--config", str(config)],
        "formatting Kafka's log directory",
        timeout=120,
    )  # fmt: skip


def server_properties(port: int, controller_port: int, log_dir: Path) -> str:
    """server.properties for a single combined broker and controller on 127.0.0.1."""
    settings = {
        "process.roles": "broker,controller",
        "node.id": NODE_ID,
        "controller.quorum.voters": f"{NODE_ID}@{HOST}:{controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": log_dir,
        "num.partitions": 1,
        "auto.create.topics.enable": "true",
        "offsets.topic.replication.factor": 1,
        "offsets.topic.num.partitions": 1,
        "transaction.state.log.replication.factor": 1,
        "transaction.state.log.min.isr": 1,
        "transaction.state.log.num.partitions": 1,
        "share.coordinator.state.topic.replication.factor": 1,
        "share.coordinator.state.topic.min.isr": 1,
        "share.coordinator.state.topic.num.partitions": 1,
        "group.initial.rebalance.delay.ms": 0,
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def java_options() -> list[str]:
    """The JVM options: $TIERSERVE_KAFKA_JAVA_OPTS when set, else DEFAULT_JAVA_OPTS."""
    configured = os.environ.get("TIERSERVE_KAFKA_JAVA_OPTS")
    return shlex.split(configured) if configured else list(DEFAULT_JAVA_OPTS)


class KafkaBroker:
    """One Kafka 4.x process (broker and controller) on 127.0.0.1; ``bootstrap`` is its address.

    ``stop()`` is a clean shutdown and ``start()`` starts it again on the same ports with the
    same log directory, so topics and committed offsets survive; ``kill()`` is a crash.
    """

    def __init__(self, install: KafkaInstall, workdir: Path, log_path: Path) -> None:
        self.install = install
        self.workdir = workdir
        self.port, self.controller_port = free_ports(2)
        self.log_dir = workdir / "log-dir"
        self.config_path = workdir / "server.properties"
        # Written by the JVM at a clean exit, then renamed into place (same folder: atomic).
        self._archive_to_write = install.home / f"broker.jsa.{os.getpid()}-{self.port}.new"
        self.process = ServiceProcess("kafka", [], log_path, cwd=workdir)

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT``, for ``bootstrap.servers``."""
        return f"{HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.process.log_path

    def _argv(self) -> list[str]:
        archive = self.install.class_archive
        if archive.exists():
            sharing = f"-XX:SharedArchiveFile={archive}"
        else:
            sharing = f"-XX:ArchiveClassesAtExit={self._archive_to_write}"
        return [
            self.install.java,
            *java_options(),
            sharing,
            "-Djava.awt.headless=true",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
            "-cp", self.install.classpath,
            "kafka.Kafka",
            str(self.config_path),
        ]  # fmt: skip

    def start(self, timeout: float = START_TIMEOUT) -> float:
        """Start the broker and wait until it lists topics; return the seconds that took."""
        started = time.monotonic()
        if not self.log_dir.exists():
            shutil.copytree(self.install.storage_template, self.log_dir)
            self.config_path.write_text(
                server_properties(self.port, self.controller_port, self.log_dir)
            )
        self.process.argv = self._argv()
        self.process.start()
        try:
            self.process.wait_until(lambda: port_open(self.port), "listening", timeout)
            self.process.wait_until(self._lists_topics, "listing topics", timeout)
        except BaseException:
            self.process.kill()
            raise
        return time.monotonic() - started

    def _lists_topics(self) -> bool:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        metadata = admin.list_topics(timeout=2)
        return NODE_ID in metadata.brokers

    def stop(self) -> None:
        """Shut down cleanly (the first clean stop also saves the class-data archive)."""
        self.process.stop(timeout=STOP_TIMEOUT)
        self._keep_class_archive()

    def kill(self) -> None:
        """SIGKILL the broker."""
        self.process.kill()
        self._archive_to_write.unlink(missing_ok=True)

    @property
    def running(self) -> bool:
        return self.process.running

    def _keep_class_archive(self) -> None:
        written = self._archive_to_write
        if written.exists() and written.stat().st_size > 0:
            with install_lock("kafka"):
                if not self.install.class_archive.exists():
                    os.replace(written, self.install.class_archive)
        written.unlink(missing_ok=True)
