"""A topic is usable as soon as ensure_topics returns: CreateTopics returns when the
controller accepted it, and a watermark query right after once met NOT_LEADER_FOR_PARTITION
in CI. Topics are created with the configured replication, checked against the broker count at
start."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from flashsend.settings import Settings, settings_env
from producers.mail_topics import ensure_mail_topics
from producers.topics import Replication, ensure_topics


def test_every_partition_answers_right_after_creation(settings: Settings) -> None:
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "t"})
    try:
        for _ in range(10):
            name = f"fresh-{uuid.uuid4().hex[:10]}"
            ensure_topics(settings.kafka_bootstrap, {name: 12})
            for p in range(12):
                low, high = consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)
                assert (low, high) == (0, 0)
    finally:
        consumer.close()


def _described(bootstrap: str, name: str) -> tuple[int, str]:
    """(replicas of partition 0, min.insync.replicas) of a topic, as the broker has them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    replicas = len(admin.list_topics(name, timeout=10).topics[name].partitions[0].replicas)
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    return replicas, configs["min.insync.replicas"].value


def test_topics_carry_the_configured_replication(settings: Settings) -> None:
    s = settings.model_copy(update={"topic_min_insync_replicas": 1})
    ensure_mail_topics(s)
    ensure_topics(s.kafka_bootstrap, {s.topic_recipients: 2}, replication=Replication.of(s))
    for topic in (s.topic_order_events, s.topic_mail_events, s.topic_dlq, s.topic_recipients):
        assert _described(s.kafka_bootstrap, topic) == (1, "1")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"FLASHSEND_TOPIC_REPLICATION_FACTOR": "3"},
            "FLASHSEND_TOPIC_REPLICATION_FACTOR=3 but the cluster has 1 broker(s)",
        ),
        (
            {"FLASHSEND_TOPIC_MIN_INSYNC_REPLICAS": "2"},
            "FLASHSEND_TOPIC_MIN_INSYNC_REPLICAS=2 exceeds FLASHSEND_TOPIC_REPLICATION_FACTOR=1",
        ),
    ],
)
@pytest.mark.parametrize("role", ["campaign", "mail", "feedback"])
def test_a_worker_refuses_a_replication_the_cluster_cannot_hold(
    settings: Settings, role: str, env: dict[str, str], expected: str
) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "flashsend.cli", "worker", "--role", role],
        env={**os.environ, **settings_env(settings), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], run.stderr[-2000:]
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    assert settings.topic_dlq not in admin.list_topics(timeout=10).topics  # nothing created
