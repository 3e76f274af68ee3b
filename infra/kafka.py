"""A real single-node Apache Kafka broker (KRaft) assembled from Maven Central.

`infra/kafka/pom.xml` pins the broker version; `mvn dependency:copy-dependencies` puts the
jars in the cache dir once, then the broker runs as `java -cp libs/* kafka.Kafka`.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

from flashsend.settings import Settings
from infra.errors import PrerequisiteMissing, StackError
from infra.maven import copy_dependencies
from infra.process import ManagedProcess, port_open, require_free_port, wait_until

POM = Path(__file__).parent / "kafka" / "pom.xml"

LOG4J2 = """\
<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <Console name="stdout" target="SYSTEM_OUT">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
    </Console>
  </Appenders>
  <Loggers>
    <Root level="WARN"><AppenderRef ref="stdout"/></Root>
    <Logger name="kafka.server.KafkaRaftServer" level="INFO"/>
    <Logger name="kafka.server.BrokerServer" level="INFO"/>
  </Loggers>
</Configuration>
"""


def kafka_version() -> str:
    match = re.search(r"<kafka.version>([^<]+)</kafka.version>", POM.read_text())
    assert match, "infra/kafka/pom.xml must define kafka.version"
    return match.group(1)


def libs_dir(settings: Settings) -> Path:
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:12]
    return settings.cache_dir / f"kafka-{kafka_version()}-{digest}" / "libs"


def require_java() -> str:
    java = shutil.which("java")
    if java is None:
        raise PrerequisiteMissing(
            "java not found: install a JDK >= 17 (e.g. apt-get install openjdk-17-jre-headless)"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)', out)
    if match is None or int(match.group(1)) < 17:
        raise PrerequisiteMissing(
            f"java >= 17 needed, found: {out.splitlines()[0] if out else '?'}"
        )
    return java


def ensure_jars(settings: Settings) -> Path:
    """Resolve the broker jars from Maven Central once; later calls are a directory check."""
    return copy_dependencies(POM, libs_dir(settings), "Kafka")


class KafkaBroker:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.home = settings.state_dir / "kafka"
        self.process = ManagedProcess("kafka", settings.state_dir / "run")

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    def _write_config(self) -> Path:
        s = self.settings
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{s.kafka_controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{s.kafka_port},"
            f"CONTROLLER://127.0.0.1:{s.kafka_controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{s.kafka_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": str(s.partitions),
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "share.coordinator.state.topic.num.partitions": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "log.retention.hours": "168",
            "num.network.threads": "2",
            "num.io.threads": "4",
        }
        self.home.mkdir(parents=True, exist_ok=True)
        path = self.home / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        (self.home / "log4j2.xml").write_text(LOG4J2)
        return path

    def _java_cmd(self, libs: Path, java: str, *args: str) -> list[str]:
        heap = self.settings.kafka_heap_mb
        return [
            java,
            f"-Xms{heap}m",
            f"-Xmx{heap}m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.home / 'log4j2.xml'}",
            "-cp",
            f"{libs}/*",
            *args,
        ]

    def _format(self, libs: Path, java: str, config: Path) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        cluster_id = new_cluster_id()
        cmd = self._java_cmd(
            libs, java, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config)
        )
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise StackError(f"kafka storage format failed: {proc.stdout}{proc.stderr}".strip())

    def running(self) -> bool:
        return self.process.pid() is not None

    def ready(self) -> bool:
        return port_open(self.settings.kafka_port) and _metadata_ok(self.settings.kafka_bootstrap)

    def start(self, *, timeout: float = 90.0) -> float:
        """Start the broker (no-op if running); return seconds until it answered metadata."""
        if self.running():
            return 0.0
        java = require_java()
        libs = ensure_jars(self.settings)
        require_free_port(self.settings.kafka_port, "kafka", "FLASHSEND_KAFKA_PORT")
        require_free_port(
            self.settings.kafka_controller_port,
            "kafka controller",
            "FLASHSEND_KAFKA_CONTROLLER_PORT",
        )
        config = self._write_config()
        self._format(libs, java, config)
        self.process.start(
            self._java_cmd(libs, java, "kafka.Kafka", str(config)), env=dict(os.environ)
        )
        try:
            return wait_until(
                self.ready,
                timeout=timeout,
                what="kafka broker",
                alive=self.running,
                log=self.process.log_file,
            )
        except StackError:
            self.process.stop()
            raise

    def stop(self) -> bool:
        return self.process.stop(timeout=30)


def _metadata_ok(bootstrap: str) -> bool:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(
        {"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 1000}
    )
    try:
        md = admin.list_topics(timeout=1.0)
    except Exception:
        return False
    return bool(md.brokers)


def new_cluster_id() -> str:
    """A random cluster id as Kafka's own `Uuid.randomUuid()` makes one: URL-safe base64 of
    16 random bytes, never starting with '-', which the storage tool's argument parser takes
    for an option (1 id in 64; the stack then failed to start with a usage message)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id
