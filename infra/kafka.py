"""A real Apache Kafka cluster (KRaft) assembled from Maven Central: one node by default,
`FLASHSEND_KAFKA_BROKERS` nodes otherwise, each both broker and controller (combined mode: the
smallest cluster that survives the loss of any one node when it has three).

`infra/kafka/pom.xml` pins the broker version; `mvn dependency:copy-dependencies` puts the
jars in the cache dir once, then each node runs as `java -cp libs/* kafka.Kafka`.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
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


def dedupe_buffer_bytes(heap_mb: int) -> int:
    """The log cleaner's dedupe buffer for a node with `heap_mb` of heap: an eighth of it,
    at least 16 MiB (pure)."""
    return max(16, heap_mb // 8) * 1024 * 1024


class KafkaBroker:
    """One node of the local cluster (node 0 keeps the single-node layout: `kafka/`)."""

    def __init__(self, settings: Settings, node: int = 0) -> None:
        self.settings = settings
        self.node = node
        name = "kafka" if node == 0 else f"kafka-{node + 1}"
        self.home = settings.state_dir / name
        self.process = ManagedProcess(name, settings.state_dir / "run")
        self.port, self.controller_port = settings.kafka_node_ports(node)

    @property
    def data_dir(self) -> Path:
        return self.home / "data"

    def _write_config(self) -> Path:
        s = self.settings
        nodes = s.kafka_brokers
        voters = ",".join(f"{i + 1}@127.0.0.1:{s.kafka_node_ports(i)[1]}" for i in range(nodes))
        replicas = str(min(3, nodes))  # the internal topics survive one node's loss from 3 on
        min_isr = str(min(2, nodes))
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node + 1),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": str(s.partitions),
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            "share.coordinator.state.topic.num.partitions": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
            "log.retention.hours": "168",
            "num.network.threads": "2",
            "num.io.threads": "4",
            # The log cleaner allocates this buffer at start (default 128 MiB): in a small heap
            # (the test clusters' 256 MiB) the allocation can fail and the node exits with
            # OutOfMemoryError. An eighth of the heap cleans the few compacted topics here.
            "log.cleaner.dedupe.buffer.size": str(dedupe_buffer_bytes(s.kafka_heap_mb)),
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

    def _format(self, libs: Path, java: str, config: Path, cluster_id: str) -> None:
        if (self.data_dir / "meta.properties").exists():
            return
        cmd = self._java_cmd(
            libs, java, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(config)
        )
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise StackError(f"kafka storage format failed: {proc.stdout}{proc.stderr}".strip())

    def running(self) -> bool:
        return self.process.pid() is not None

    def ready(self) -> bool:
        """This node answers metadata, and the cluster has all its brokers."""
        bootstrap = f"127.0.0.1:{self.port}"
        return port_open(self.port) and _metadata_ok(bootstrap, self.settings.kafka_brokers)

    def launch(self, cluster_id: str) -> None:
        """Start this node's process (no-op if running) without waiting for it."""
        if self.running():
            return
        java = require_java()
        libs = ensure_jars(self.settings)
        suffix = (
            "" if self.node == 0 else f" (node {self.node + 1}: the base port + {10 * self.node})"
        )
        require_free_port(self.port, "kafka", "FLASHSEND_KAFKA_PORT" + suffix)
        require_free_port(
            self.controller_port, "kafka controller", "FLASHSEND_KAFKA_CONTROLLER_PORT" + suffix
        )
        config = self._write_config()
        self._format(libs, java, config, cluster_id)
        self.process.start(
            self._java_cmd(libs, java, "kafka.Kafka", str(config)), env=dict(os.environ)
        )

    def start(self, *, timeout: float = 90.0) -> float:
        """Start this node (no-op if running) and wait until the cluster answers with all its
        brokers: the other nodes must be running too (`KafkaCluster.start`)."""
        if self.running():
            return 0.0
        self.launch(cluster_id_of(self.settings))
        return self.wait(timeout)

    def wait(self, timeout: float = 90.0) -> float:
        try:
            return wait_until(
                self.ready,
                timeout=timeout,
                what=f"kafka node {self.node + 1}",
                alive=self.running,
                log=self.process.log_file,
            )
        except StackError:
            self.process.stop()
            raise

    def stop(self, *, discard: bool = False) -> bool:
        """SIGTERM: a controlled shutdown (its logs need no recovery at the next start);
        `discard`: SIGKILL, for a node whose data is thrown away next."""
        if discard:
            return self.process.stop(timeout=5, sig=signal.SIGKILL)
        return self.process.stop(timeout=30)


class KafkaCluster:
    """The local cluster: `settings.kafka_brokers` nodes, started and stopped together."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.nodes = [KafkaBroker(settings, i) for i in range(settings.kafka_brokers)]

    @property
    def process(self) -> ManagedProcess:
        """Node 1's process (the single node of the default cluster)."""
        return self.nodes[0].process

    def running(self) -> bool:
        return all(node.running() for node in self.nodes)

    def ready(self) -> bool:
        return all(node.ready() for node in self.nodes)

    def start(self, *, timeout: float = 90.0) -> float:
        """Start every node (no-op for those running); seconds until all answered. The nodes
        start together: a quorum of controllers must be up before any of them serves."""
        began = time.monotonic()
        cluster_id = cluster_id_of(self.settings)
        for node in self.nodes:
            node.launch(cluster_id)
        try:
            for node in self.nodes:
                node.wait(max(1.0, timeout - (time.monotonic() - began)))
        except StackError:
            self.stop()
            raise
        return time.monotonic() - began

    def stop(self, *, discard: bool = False) -> bool:
        """Stop every node, also those of a larger cluster started earlier from this state dir
        (`flashsend down` without the FLASHSEND_KAFKA_BROKERS it was started with). `discard`:
        kill them at once, when their data is deleted next (a controlled shutdown of one node
        waits for leaders to move, ~10 s a node)."""
        stopped = [node.stop(discard=discard) for node in self.nodes]
        run_dir = self.settings.state_dir / "run"
        known = {node.process.name for node in self.nodes}
        for pid_file in sorted(run_dir.glob("kafka-*.pid")):
            if pid_file.stem not in known:
                stopped.append(ManagedProcess(pid_file.stem, run_dir).stop(timeout=30))
        return all(stopped)


def cluster_id_of(settings: Settings) -> str:
    """The cluster id all nodes are formatted with, kept in the state dir (a node added to a
    formatted cluster must join it, not start another)."""
    path = settings.state_dir / "kafka" / "cluster-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    meta = settings.state_dir / "kafka" / "data" / "meta.properties"
    if meta.exists():  # formatted before the id was kept here
        match = re.search(r"^cluster\.id=(\S+)$", meta.read_text(), re.MULTILINE)
        if match:
            path.write_text(match.group(1))
            return match.group(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    cluster_id = new_cluster_id()
    path.write_text(cluster_id)
    return cluster_id


def partition_leaders(bootstrap: str, topic: str) -> dict[int, int]:
    """The node id leading each partition of `topic` (-1: none right now), as the cluster's
    metadata says."""
    from producers.topics import admin_client

    md = admin_client(bootstrap).list_topics(topic, timeout=10)
    meta = md.topics.get(topic)
    if meta is None or meta.error is not None:
        raise StackError(f"kafka at {bootstrap}: no metadata for topic {topic!r}")
    return {int(p): int(info.leader) for p, info in meta.partitions.items()}


def busiest_leader(leaders: dict[int, int]) -> int:
    """The node id leading the most partitions (the lowest id on a tie); ValueError if no
    partition has a leader."""
    counts: dict[int, int] = {}
    for node in leaders.values():
        if node >= 0:
            counts[node] = counts.get(node, 0) + 1
    if not counts:
        raise ValueError("no partition has a leader")
    return min(counts, key=lambda node: (-counts[node], node))


def broker_ids(bootstrap: str) -> list[int]:
    """The node ids of the brokers the cluster's metadata lists."""
    from producers.topics import admin_client

    md = admin_client(bootstrap).list_topics(timeout=10)
    return sorted(int(b) for b in md.brokers)


def _metadata_ok(bootstrap: str, brokers: int = 1) -> bool:
    from producers.topics import admin_client

    admin = admin_client(bootstrap, **{"socket.connection.setup.timeout.ms": 1000})
    try:
        md = admin.list_topics(timeout=1.0)
    except Exception:
        return False
    return len(md.brokers) >= brokers


def new_cluster_id() -> str:
    """A random cluster id as Kafka's own `Uuid.randomUuid()` makes one: URL-safe base64 of
    16 random bytes, never starting with '-', which the storage tool's argument parser takes
    for an option (1 id in 64; the stack then failed to start with a usage message)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id
