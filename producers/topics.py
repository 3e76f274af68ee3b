"""Topic creation (idempotent). Our broker runs with auto-create off: a typo in a topic name
fails loudly instead of silently creating a one-partition topic."""

from __future__ import annotations

import time

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    NewTopic,
    OffsetSpec,
)

from flashsend.errors import FlashsendError


def ensure_topics(bootstrap: str, topics: dict[str, int], *, timeout: float = 30.0) -> None:
    """Create missing topics with the given partition counts (replication factor 1 locally)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise FlashsendError(f"Kafka at {bootstrap} is not reachable: {exc}") from exc
    missing = [
        NewTopic(name, partitions, 1) for name, partitions in topics.items() if name not in existing
    ]
    if not missing:
        return
    for name, future in admin.create_topics(missing, request_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise FlashsendError(f"could not create topic {name}: {exc}") from exc
    wait_until_answering(admin, [t.topic for t in missing], timeout=timeout)


def wait_until_answering(admin: AdminClient, names: list[str], *, timeout: float = 30.0) -> None:
    """Return once every partition of `names` answers an offsets query.

    CreateTopics returns when the controller has accepted the topic. The broker's metadata
    names a leader before the leader has the partition: a watermark query right after
    creation met NOT_LEADER_FOR_PARTITION in CI, and waiting for leaders in the metadata was
    not enough (tests/integration/test_topics.py failed so), so this asks for the offsets."""
    deadline = time.monotonic() + timeout
    while True:
        topics = admin.list_topics(timeout=timeout).topics
        wanted = {
            TopicPartition(name, p): OffsetSpec.latest()  # type: ignore[no-untyped-call]
            for name in names
            if name in topics
            for p in topics[name].partitions
        }
        waiting = [name for name in names if name not in topics or not topics[name].partitions]
        if wanted and not waiting:
            for tp, future in admin.list_offsets(wanted, request_timeout=timeout).items():
                try:
                    future.result()
                except KafkaException:
                    waiting.append(f"{tp.topic}[{tp.partition}]")
            if not waiting:
                return
        if time.monotonic() > deadline:
            raise FlashsendError(f"topics not ready after {timeout:.0f}s: {waiting}")
        time.sleep(0.05)
