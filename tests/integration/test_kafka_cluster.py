"""A local 3-node KRaft cluster (`FLASHSEND_KAFKA_BROKERS=3`): topics get 3 replicas and
min.insync.replicas 2, an idempotent acks=all producer loses and duplicates nothing while the
leader of its partition is SIGKILLed and comes back, and a campaign keeps sending through the
loss of the node leading most of its partitions, also as `flashsend chaos --kill-broker-at`
runs it."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    PartitionMetadata,
)

from flashsend.errors import FlashsendError
from flashsend.lab.chaos import ChaosOptions, run_chaos
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings, load_settings
from infra.kafka import KafkaCluster, broker_ids, busiest_leader, partition_leaders
from infra.process import free_port
from producers.campaign import start_campaign
from producers.topics import Replication, ensure_topics
from sinks.users import seed_users
from tests.integration.campaign_helpers import new_campaign, stats, statuses, wait_finished

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


# One worker runs this module: its module fixture is a process of its own.
pytestmark = pytest.mark.xdist_group("kafka_cluster")


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
        kafka.stop(discard=True)  # its state dir is pytest's, thrown away


def partition_of(settings: Settings, topic: str, partition: int) -> PartitionMetadata:
    """The partition as the cluster's metadata shows it, once it shows it: brokers learn of a
    new topic from the controller one by one, so the one asked may not know it yet."""
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    deadline = time.monotonic() + 30
    while True:
        md = admin.list_topics(topic, timeout=10).topics[topic]
        if partition in md.partitions:
            return md.partitions[partition]
        assert time.monotonic() < deadline, f"{topic}[{partition}] missing from the metadata"
        time.sleep(0.1)


def leader_of(settings: Settings, topic: str, partition: int) -> int:
    return int(partition_of(settings, topic, partition).leader)


def test_three_nodes_replicate_and_survive_the_loss_of_a_leader(cluster: KafkaCluster) -> None:
    s = cluster.settings
    assert Replication.of(s) == Replication(3, 2)
    admin = AdminClient({"bootstrap.servers": s.kafka_bootstrap})
    assert len(admin.list_topics(timeout=10).brokers) == NODES

    topic = f"cluster-{uuid.uuid4().hex[:8]}"
    ensure_topics(s.kafka_bootstrap, {topic: 1}, replication=Replication.of(s))
    assert len(partition_of(s, topic, 0).replicas) == 3
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

    # A process starting meanwhile (a worker replaced during the outage) finds its topics and
    # starts; only a topic still to be created is refused: it could not get its 3 replicas.
    deadline = time.monotonic() + 30
    while len(broker_ids(s.kafka_bootstrap)) != NODES - 1:  # the controller fenced the node
        assert time.monotonic() < deadline, broker_ids(s.kafka_bootstrap)
        time.sleep(0.2)
    ensure_topics(s.kafka_bootstrap, {topic: 1}, replication=Replication.of(s))
    with pytest.raises(FlashsendError, match="the cluster has 2 broker"):
        ensure_topics(s.kafka_bootstrap, {f"{topic}-new": 1}, replication=Replication.of(s))

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


def on_cluster(settings: Settings, cluster: KafkaCluster) -> Settings:
    """The test's settings (PostgreSQL and SES from the session's stack, its own database and
    topics) on the cluster: its bootstrap, replication, and the layout its nodes are started
    with (state dir with their pid files, ports, heap)."""
    c = cluster.settings
    return settings.model_copy(
        update={
            "kafka_bootstrap": c.kafka_bootstrap,
            "kafka_brokers": NODES,
            "kafka_port": c.kafka_port,
            "kafka_controller_port": c.kafka_controller_port,
            "kafka_heap_mb": c.kafka_heap_mb,
            "state_dir": c.state_dir,
            "topic_replication_factor": 3,
            "topic_min_insync_replicas": 2,
        }
    )


def test_campaigns_start_and_send_while_the_busiest_leader_is_down(
    cluster: KafkaCluster, settings: Settings
) -> None:
    """The campaign topic on the cluster (PostgreSQL and SES from the session's stack): the
    node leading most of its partitions is SIGKILLed mid-campaign. While it is down, a second
    campaign starts (its doorbells need acks from 2 of the 3 replicas) and sends; the node
    comes back and both campaigns end with every recipient sent once."""
    s = on_cluster(settings, cluster)
    seed_users(s.pg_dsn, 6_000)
    first = new_campaign(s, rate=1_000)
    pool = WorkerPool(s, s.state_dir / f"logs-cluster-{first}")
    try:
        pool.start(2)
        start_campaign(s, first)
        deadline = time.monotonic() + 120
        while statuses(s, first).get("sent", 0) < 1_000:
            assert time.monotonic() < deadline, statuses(s, first)
            time.sleep(0.1)
        leaders = partition_leaders(s.kafka_bootstrap, s.topic_recipients)
        victim = cluster.nodes[busiest_leader(leaders) - 1]
        pid = victim.process.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        second = new_campaign(s, rate=0, name="during the outage")
        start_campaign(s, second)  # produced with acks=all: 2 in-sync replicas suffice
        while statuses(s, second).get("sent", 0) < 1_000:
            assert time.monotonic() < deadline, statuses(s, second)
            time.sleep(0.1)
        assert victim.process.pid() is None  # still down: the cluster did it without it
        victim.start(timeout=120)
        for cid in (first, second):
            wait_finished(s, cid, pool, timeout=180)
    finally:
        pool.stop()
    for cid in (first, second):
        final = statuses(s, cid)
        seen = stats(s, cid)
        assert final.get("unknown", 0) == 0 and final.get("failed", 0) == 0, final
        assert seen["duplicates"] == 0, seen
        assert seen["accepted"] == final["sent"], (seen, final)


def test_chaos_kills_the_busiest_leader_and_the_campaign_sends_while_it_is_down(
    cluster: KafkaCluster, settings: Settings
) -> None:
    """`flashsend chaos --kill-broker-at` on the cluster: the node leading most of the campaign
    topic's partitions is SIGKILLed and stays down past the controller's session timeout; SES
    accepts recipients of the campaign meanwhile, the node comes back, and nobody is mailed
    twice or lost. (With worker kills too: `flashsend chaos`, docs/operations.md.)"""
    s = on_cluster(settings, cluster)
    result = run_chaos(
        s,
        ChaosOptions(
            # ~6,900 recipients at 250/s: sending outlasts the outage from 8 s to 20 s.
            users=8_000,
            workers=2,
            rate=250,
            kill_every_s=0,
            kill_broker_at=8,
            broker_down_s=12,
            lease_s=15,
            timeout_s=180,
            events_wait_s=0,
        ),
        log=print,
    )
    print(json.dumps(result, indent=1, sort_keys=True))
    assert "error" not in result, result["error"]
    assert result["broker_kills"] == 1, result
    killed = result["broker_killed"]
    assert killed["partitions_led"] >= s.partitions // NODES, killed
    assert killed["accepted_while_down"] > 0, killed
    assert result["duplicates"] == 0 and result["lost"] == 0, result
    assert result["invariants_ok"], result["invariants_failed"]
    assert broker_ids(s.kafka_bootstrap) == [1, 2, 3]  # the killed node is back
