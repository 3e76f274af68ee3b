"""A topic is usable as soon as ensure_topics returns: CreateTopics returns when the
controller accepted it, and a watermark query right after once met NOT_LEADER_FOR_PARTITION
in CI."""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, TopicPartition

from flashsend.settings import Settings
from producers.topics import ensure_topics


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
