"""Dead letters: records we cannot process go to a DLQ topic at once, with the reason in
headers, so the partition keeps flowing and an operator can inspect and replay them.

A dead letter keeps the record's own headers too (before ours): consumers read some of them
(`flashsend.schema` tells the feedback agent how to decode a `mail.events` record), so a replay
without them would be skipped, and tracing headers say where the record came from."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, Producer

from flashsend.errors import FlashsendError

Header = tuple[str, bytes | None]

# The headers a dead letter adds, in order (DeadLetter.headers writes them from this tuple); a
# replay strips exactly these (flashsend.schema is the record's own and must go back with it).
_ADDED = (
    "flashsend.reason",
    "flashsend.detail",
    "flashsend.topic",
    "flashsend.partition",
    "flashsend.offset",
    "flashsend.failed_at_ms",
)
DLQ_HEADERS = frozenset(_ADDED)


def record_headers(headers: Any) -> tuple[Header, ...]:
    """A consumed record's headers as (name, bytes) pairs, in order. Faust gives a list of
    pairs or a mapping, confluent-kafka a list or None."""
    if not headers:
        return ()
    items = headers.items() if hasattr(headers, "items") else headers
    return tuple(
        (str(k), v if v is None or isinstance(v, bytes) else str(v).encode()) for k, v in items
    )


class DeadLetterFailed(FlashsendError):
    """The dead-letter topic did not acknowledge; the batch must not be committed."""


@dataclass(frozen=True)
class DeadLetter:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str
    detail: str = ""
    original_headers: tuple[Header, ...] = ()

    @classmethod
    def of(cls, rec: Any, reason: str, detail: str = "") -> DeadLetter:
        """The dead letter of a consumed Faust record (topic, partition, offset, key, value and
        headers as attributes)."""
        return cls(
            rec.topic,
            rec.partition,
            rec.offset,
            rec.key,
            rec.value,
            reason,
            detail,
            record_headers(getattr(rec, "headers", None)),
        )

    def headers(self) -> list[tuple[str, str | bytes | None]]:
        own = [(k, v) for k, v in self.original_headers if k not in DLQ_HEADERS]
        added = (
            self.reason,
            self.detail[:1000],
            self.topic,
            str(self.partition),
            str(self.offset),
            str(int(time.time() * 1000)),
        )
        return [*own, *((k, v.encode()) for k, v in zip(_ADDED, added, strict=True))]


class DeadLetterProducer:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = topic
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 30000,
            }
        )

    def publish_blocking(self, letters: Sequence[DeadLetter], timeout: float = 30.0) -> None:
        errors: list[str] = []

        def on_delivery(err: object, _msg: object) -> None:
            if err is not None:
                errors.append(str(err))

        try:
            for letter in letters:
                self._producer.produce(
                    self.topic,
                    key=letter.key,
                    value=letter.value,
                    headers=letter.headers(),
                    on_delivery=on_delivery,
                )
        except (KafkaException, BufferError) as exc:
            raise DeadLetterFailed(str(exc)) from exc
        remaining = self._producer.flush(timeout)
        if remaining or errors:
            raise DeadLetterFailed(f"{remaining} undelivered, errors: {errors[:3]}")

    async def publish(self, letters: Sequence[DeadLetter]) -> None:
        if letters:
            await asyncio.to_thread(self.publish_blocking, letters)


def read_dead_letters(
    bootstrap: str, topic: str, *, limit: int = 50, timeout: float = 5.0
) -> list[dict[str, Any]]:
    """Read the dead-letter topic from the beginning without committing anything."""
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"dlq-reader-{uuid.uuid4()}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    out: list[dict[str, Any]] = []
    try:
        md = consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        if md is None or md.error is not None:
            return []
        consumer.assign([TopicPartition(topic, p, 0) for p in md.partitions])
        idle_deadline = time.monotonic() + timeout
        while len(out) < limit and time.monotonic() < idle_deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            idle_deadline = time.monotonic() + 1.0
            raw_headers: list[tuple[str, Any]] = list(msg.headers() or [])  # type: ignore[arg-type]
            headers = {
                str(k): (v.decode(errors="replace") if isinstance(v, bytes) else str(v or ""))
                for k, v in raw_headers
            }
            out.append(
                {
                    "dlq_offset": msg.offset(),
                    "reason": headers.get("flashsend.reason", "?"),
                    "detail": headers.get("flashsend.detail", ""),
                    "topic": headers.get("flashsend.topic", ""),
                    "partition": int(headers.get("flashsend.partition", "-1")),
                    "offset": int(headers.get("flashsend.offset", "-1")),
                    "failed_at_ms": int(headers.get("flashsend.failed_at_ms", "0")),
                    "value_hex": (msg.value() or b"")[:64].hex(),
                }
            )
    finally:
        consumer.close()
    return out
