"""Topic creation (idempotent). Our broker runs with auto-create off: a typo in a topic name
fails loudly instead of silently creating a one-partition topic.

Replication is a setting (`FLASHSEND_TOPIC_REPLICATION_FACTOR`, `FLASHSEND_TOPIC_MIN_INSYNC_
REPLICAS`; 1 and 1 for the single local broker, 3 and 2 in production: docs/operations.md).
Every process that creates topics first checks the pair against the cluster's broker count, so
a factor the cluster cannot hold stops the process at start with one line instead of a
CreateTopics error, or a producer whose `acks=all` can never be met, later. Once the topics
exist, only the pair itself is checked: the live broker count is what a broker outage lowers,
and a worker replaced meanwhile (a crash, a rolling restart) must start on the replicas left.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    NewTopic,
    OffsetSpec,
)

from flashsend.errors import FlashsendError


def admin_client(bootstrap: str, **conf: Any) -> AdminClient:
    """A short-lived admin client that leaves stderr to its caller's error. librdkafka prints
    each failed connect, one line every 50 ms while a call waits; the callers turn a failure
    into one line of their own, so only critical lines pass (log_level 2)."""
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 2, **conf})


@dataclass(frozen=True)
class Replication:
    """Replicas per partition, and how many must acknowledge a write (producers use acks=all)."""

    factor: int = 1
    min_insync: int = 1

    @classmethod
    def of(cls, settings: Any) -> Replication:
        return cls(settings.topic_replication_factor, settings.topic_min_insync_replicas)

    def problem(self, brokers: int | None) -> str | None:
        """Why this cannot work on a cluster of `brokers` live brokers (None: it can; `brokers`
        None: the topics exist, so only the pair itself is checked). Pure."""
        if self.factor < 1 or self.min_insync < 1:
            return (
                f"FLASHSEND_TOPIC_REPLICATION_FACTOR={self.factor} and "
                f"FLASHSEND_TOPIC_MIN_INSYNC_REPLICAS={self.min_insync} must be >= 1"
            )
        if self.min_insync > self.factor:
            return (
                f"FLASHSEND_TOPIC_MIN_INSYNC_REPLICAS={self.min_insync} exceeds "
                f"FLASHSEND_TOPIC_REPLICATION_FACTOR={self.factor}: no write could be acknowledged"
            )
        if brokers is not None and self.factor > brokers:
            return (
                f"FLASHSEND_TOPIC_REPLICATION_FACTOR={self.factor} but the cluster has {brokers} "
                f"broker(s): set it to at most {brokers} (local default 1; production 3 with "
                "FLASHSEND_TOPIC_MIN_INSYNC_REPLICAS=2)"
            )
        return None

    def topic_config(self) -> dict[str, str]:
        return {"min.insync.replicas": str(self.min_insync)}


def check_replication(
    admin: AdminClient, bootstrap: str, replication: Replication, *, creating: bool = True
) -> None:
    """Raise one line when the cluster cannot hold `replication` (at process start). Not
    `creating` (every topic exists): the pair only, whatever the brokers up right now."""
    brokers: int | None = None
    if creating:
        try:
            brokers = len(admin.list_topics(timeout=10).brokers)
        except KafkaException as exc:
            raise FlashsendError(f"Kafka at {bootstrap} is not reachable: {exc}") from exc
    problem = replication.problem(brokers)
    if problem:
        raise FlashsendError(f"Kafka at {bootstrap}: {problem}")


def ensure_topics(
    bootstrap: str,
    topics: dict[str, int],
    *,
    replication: Replication | None = None,
    timeout: float = 30.0,
) -> None:
    """Create missing topics with the given partition counts and replication (default: one
    replica, the local broker), after checking the replication against the cluster."""
    replication = replication or Replication()
    admin = admin_client(bootstrap)
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise FlashsendError(f"Kafka at {bootstrap} is not reachable: {exc}") from exc
    missing = [
        NewTopic(name, partitions, replication.factor, config=replication.topic_config())
        for name, partitions in topics.items()
        if name not in existing
    ]
    check_replication(admin, bootstrap, replication, creating=bool(missing))
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
