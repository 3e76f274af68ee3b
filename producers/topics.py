"""Topic creation (idempotent). Our broker runs with auto-create off: a typo in a topic name
fails loudly instead of silently creating a one-partition topic."""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

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
