"""A local 3-node KRaft cluster (`FLASHSEND_KAFKA_BROKERS=3`): topics get 3 replicas and
min.insync.replicas 2, and an idempotent acks=all producer loses and duplicates nothing while
the leader of its partition is SIGKILLed and comes back."""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from flashsend.settings import Settings, load_settings
from infra.kafka import KafkaCluster
from infra.process import free_port
from producers.topics import Replication, ensure_topics

NODES = 3


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port() -> int:
    """A port p such that p + 10 i are free for every node i (the cluster's port layout)."""
    while True:
        base = free_port()
        if base + 10 * NODES < 65536 and all(_bindable(base + 10 * i) for i in range(NODES)):
            return base


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    state_dir: Path = tmp_path_factory.mktemp("cluster")
    settings = load_settings(
        state_dir=state_dir,
        kafka_brokers=NODES,
        kafka_port=free_base_port(),
        kafka_controller_port=free_base_port(),
        kafka_heap_mb=256,
        local_services=("kafka",),
    )
    kafka = KafkaCluster(settings)
    kafka.start(timeout=180)
    try:
        yield kafka
    finally:
        kafka.stop()


def leader_of(settings: Settings, topic: str, partition: int) -> int:
    md = AdminClient({"bootstrap.servers": settings.kafka_bootstrap}).list_topics(topic, timeout=10)
    return int(md.topics[topic].partitions[partition].leader)


def test_three_nodes_replicate_and_survive_the_loss_of_a_leader(cluster: KafkaCluster) -> None:
    s = cluster.settings
    assert Replication.of(s) == Replication(3, 2)
    admin = AdminClient({"bootstrap.servers": s.kafka_bootstrap})
    assert len(admin.list_topics(timeout=10).brokers) == NODES

    topic = f"cluster-{uuid.uuid4().hex[:8]}"
    ensure_topics(s.kafka_bootstrap, {topic: 1}, replication=Replication.of(s))
    md = admin.list_topics(topic, timeout=10).topics[topic]
    assert len(md.partitions[0].replicas) == 3
    [config] = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)]).values()
    assert config.result(timeout=10)["min.insync.replicas"].value == "2"

    producer = Producer(
        {"bootstrap.servers": s.kafka_bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    failed: list[str] = []

    def sent(err: object, _msg: object) -> None:
        if err is not None:
            failed.append(str(err))

    total = 3_000
    leader = leader_of(s, topic, 0)
    victim = cluster.nodes[leader - 1]  # node ids are 1-based
    for i in range(total):
        producer.produce(topic, key=str(i).encode(), value=str(i).encode(), on_delivery=sent)
        producer.poll(0)
        if i == total // 3:
            pid = victim.process.pid()
            assert pid is not None
            os.kill(pid, signal.SIGKILL)  # the partition's leader, mid-stream
        if i % 100 == 0:
            time.sleep(0.01)
    assert producer.flush(120) == 0
    assert failed == []
    assert leader_of(s, topic, 0) != leader  # another replica took over

    victim.start(timeout=120)  # rejoins the cluster
    assert len(admin.list_topics(timeout=10).brokers) == NODES

    consumer = Consumer(
        {
            "bootstrap.servers": s.kafka_bootstrap,
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen: list[int] = []
    deadline = time.monotonic() + 60
    while len(seen) < total and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is not None and msg.error() is None:
            seen.append(int(msg.value() or b"-1"))
    consumer.close()
    assert len(seen) == total and sorted(seen) == list(range(total)), (len(seen), len(set(seen)))
