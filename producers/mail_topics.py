"""Topics of the transactional path, created with the retention the dedupe keys rely on."""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined,unused-ignore]
    ConfigResource,
    NewTopic,
)

from flashsend.errors import FlashsendError
from flashsend.settings import Settings
from producers.topics import Replication, admin_client, check_replication


def ensure_mail_topics(settings: Settings, *, timeout: float = 30.0) -> None:
    """order.events (retention = order_events_retention_s), mail.events and the DLQ."""
    admin = admin_client(settings.kafka_bootstrap)
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise FlashsendError(
            f"Kafka at {settings.kafka_bootstrap} is not reachable: {exc}"
        ) from exc
    replication = Replication.of(settings)
    factor, config = replication.factor, replication.topic_config()
    retention = {"retention.ms": str(int(settings.order_events_retention_s * 1000)), **config}
    partitions = settings.order_events_partitions
    wanted = [
        NewTopic(settings.topic_order_events, partitions, factor, config=retention),
        NewTopic(settings.topic_mail_events, partitions, factor, config=config),
        NewTopic(settings.topic_dlq, 1, factor, config=config),
    ]
    missing = [t for t in wanted if t.topic not in existing]
    check_replication(admin, settings.kafka_bootstrap, replication, creating=bool(missing))
    if not missing:
        return
    for name, future in admin.create_topics(missing, request_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise FlashsendError(f"could not create topic {name}: {exc}") from exc


def topic_retention_s(bootstrap: str, topic: str, *, timeout: float = 10.0) -> float:
    """The topic's retention.ms in seconds (-1 = forever, returned as 0)."""
    admin = admin_client(bootstrap)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    try:
        configs = admin.describe_configs([resource])[resource].result(timeout=timeout)
    except KafkaException as exc:
        raise FlashsendError(f"cannot read the configuration of topic {topic}: {exc}") from exc
    value = int(configs["retention.ms"].value)
    return 0.0 if value < 0 else value / 1000.0
