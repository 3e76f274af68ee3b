"""`flashsend dlq show|replay`: inspect dead letters and put them back on their topic.

A dead letter keeps the original key and value, and says in its headers where it came from
(`flashsend.topic`, `.partition`, `.offset`) and why (`flashsend.reason`, `.detail`). After the
cause is fixed (the campaign now exists, a consumer that knows the new version is deployed),
`replay` produces each chosen letter again to its original topic and partition with the same
key and value. That is safe because every consumer deduplicates (the campaign claim needs a
pending row; the mail service's UNIQUE event_id / dedupe_key), so a letter replayed twice, or
one whose record was meanwhile processed, mails nobody twice. Each replay is recorded in
`dlq_replays` (who, when, why, where the copy landed), in the same transaction for the batch,
written only after the broker acknowledged every copy.

Letters from the SNS webhook are not records of a topic: their origin is the SNS topic ARN and
their value the raw SES notification (JSON), dead-lettered because it was not a readable SES
event. Replaying one does what the webhook does with a notification: parse it
(producers.event_messages.parse_event_message, the SNS MessageId is the letter's key, the
time the webhook received it is the letter's failed_at), encode one `ses_event` record per recipient
and produce them to mail.events keyed by address, with the webhook's headers. Nothing is
produced while any chosen letter is still unreadable: the error names them. The feedback agent
deduplicates on the event ids (uuid5 of the SES message, type and recipient).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from flashsend.errors import FlashsendError
from flashsend.settings import Settings
from producers.dlq import DLQ_HEADERS, Header, record_headers
from producers.event_messages import parse_event_message
from producers.replay import operator
from producers.ses_events import SCHEMA as SES_SCHEMA
from producers.ses_events import SesEventInvalid
from schemas.serde import AvroCodec
from schemas.serde import codec as serde_codec
from sinks.queries import query

REPLAY_HEADER = "flashsend.replayed_from"


@dataclass(frozen=True)
class Letter:
    dlq_partition: int
    dlq_offset: int
    key: bytes | None
    value: bytes | None
    raw_headers: tuple[Header, ...] = ()  # as read, bytes and order kept

    @cached_property
    def headers(self) -> dict[str, str]:
        """The headers as text, for reading and showing (the last of a repeated name wins)."""
        return {
            k: v.decode(errors="replace") if isinstance(v, bytes) else str(v or "")
            for k, v in self.raw_headers
        }

    @property
    def ref(self) -> str:
        return f"{self.dlq_partition}:{self.dlq_offset}"

    @property
    def reason(self) -> str:
        return self.headers.get("flashsend.reason", "?")

    @property
    def topic(self) -> str:
        return self.headers.get("flashsend.topic", "")

    @property
    def partition(self) -> int:
        return int(self.headers.get("flashsend.partition", "-1"))

    @property
    def offset(self) -> int:
        return int(self.headers.get("flashsend.offset", "-1"))

    @property
    def from_sns(self) -> bool:
        """Dead-lettered by the SNS webhook: its origin is an SNS topic ARN, not a topic."""
        return is_sns_arn(self.topic)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ref": self.ref,
            "dlq_partition": self.dlq_partition,
            "dlq_offset": self.dlq_offset,
            "reason": self.reason,
            "detail": self.headers.get("flashsend.detail", ""),
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "failed_at_ms": int(self.headers.get("flashsend.failed_at_ms", "0")),
            "headers": self.headers,
            "key": (self.key or b"").decode(errors="replace"),
            "value_hex": (self.value or b"").hex(),
        }


def replay_headers(letter: Letter, dlq_topic: str) -> list[tuple[str, str | bytes | None]]:
    """The record's own headers as they were (consumers read some: `flashsend.schema`), without
    the dead letter's, plus where this copy comes from (one such header, the latest)."""
    own = [(k, v) for k, v in letter.raw_headers if k not in DLQ_HEADERS and k != REPLAY_HEADER]
    return [*own, (REPLAY_HEADER, f"{dlq_topic}@{letter.ref}".encode())]


def is_sns_arn(origin: str) -> bool:
    """arn:aws:sns:<region>:<account>:<topic> (also the aws-cn and aws-us-gov partitions)."""
    parts = origin.split(":")
    return len(parts) >= 6 and parts[0] == "arn" and parts[2] == "sns"


@dataclass(frozen=True)
class Copy:
    """One record a replay produces: where to, and what."""

    letter: Letter
    topic: str
    partition: int | None  # None: the producer's partitioner, by key (as the webhook)
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, str | bytes | None]]


def sns_copies(letter: Letter, codec: AvroCodec, topic: str, dlq_topic: str) -> list[Copy]:
    """The mail.events records the webhook would have produced for this SNS letter; raises
    SesEventInvalid while its notification is still not a readable SES event."""
    received_ms = int(letter.headers.get("flashsend.failed_at_ms") or 0) or int(time.time() * 1000)
    records = parse_event_message(
        (letter.value or b"").decode(errors="replace"),
        sns_message_id=(letter.key or b"").decode(errors="replace"),
        received_at_ms=received_ms,
    )
    replayed_from = (REPLAY_HEADER, f"{dlq_topic}@{letter.ref}".encode())
    return [
        Copy(
            letter,
            topic,
            None,
            str(r["recipient"]).encode(),
            codec.encode(r),
            [
                ("flashsend.schema", SES_SCHEMA.encode()),
                ("event_type", str(r["event_type"]).encode()),
                ("event_id", str(r["event_id"]).encode()),
                replayed_from,
            ],
        )
        for r in records
    ]


def copies_of(s: Settings, letters: list[Letter]) -> list[Copy]:
    """What replaying `letters` produces: a record's letter goes back to its topic and
    partition as it was; an SNS letter becomes the webhook's records on mail.events. Raises
    FlashsendError, producing nothing, if a letter cannot be replayed."""
    copies: list[Copy] = []
    unreadable: list[str] = []
    codec: AvroCodec | None = None
    for letter in letters:
        if letter.from_sns:
            if codec is None:
                codec = serde_codec(s, SES_SCHEMA)
            try:
                copies += sns_copies(letter, codec, s.topic_mail_events, s.topic_dlq)
            except SesEventInvalid as exc:
                unreadable.append(f"{letter.ref} ({exc})")
            continue
        if not letter.topic or letter.partition < 0:
            raise FlashsendError(f"dead letter {letter.ref} does not say where it came from")
        copies.append(
            Copy(
                letter,
                letter.topic,
                letter.partition,
                letter.key,
                letter.value,
                replay_headers(letter, s.topic_dlq),
            )
        )
    if unreadable:
        raise FlashsendError(
            "nothing replayed: these SNS letters are still not readable SES events: "
            + "; ".join(unreadable[:5])
            + (f" and {len(unreadable) - 5} more" if len(unreadable) > 5 else "")
        )
    return copies


def parse_ref(ref: str) -> tuple[int, int]:
    """`12` (partition 0) or `0:12`."""
    part, _, off = ref.rpartition(":")
    try:
        return int(part or 0), int(off)
    except ValueError:
        raise FlashsendError(
            f"not a dead-letter reference: {ref!r} (OFFSET or PARTITION:OFFSET)"
        ) from None


def read_letters(s: Settings, *, timeout: float = 5.0) -> list[Letter]:
    """Every dead letter still in the topic, in (partition, offset) order. Commits nothing."""
    consumer = Consumer(
        {
            "bootstrap.servers": s.kafka_bootstrap,
            "group.id": f"flashsend-dlq-reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    letters: list[Letter] = []
    try:
        md = consumer.list_topics(s.topic_dlq, timeout=timeout).topics.get(s.topic_dlq)
        if md is None or md.error is not None:
            return []
        ends = {}
        for p in md.partitions:
            low, high = consumer.get_watermark_offsets(
                TopicPartition(s.topic_dlq, p), timeout=timeout
            )
            if high > low:
                ends[p] = high
        consumer.assign([TopicPartition(s.topic_dlq, p, 0) for p in ends])
        deadline = time.monotonic() + max(timeout, 10.0)
        while ends and time.monotonic() < deadline:
            for msg in consumer.consume(500, timeout=0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        ends.pop(msg.partition(), None)
                    continue
                partition, offset = int(msg.partition() or 0), int(msg.offset() or 0)
                letters.append(
                    Letter(partition, offset, msg.key(), msg.value(), record_headers(msg.headers()))
                )
                if offset >= ends.get(partition, 0) - 1:
                    ends.pop(partition, None)
    finally:
        consumer.close()
    return sorted(letters, key=lambda letter: (letter.dlq_partition, letter.dlq_offset))


def replayed(s: Settings) -> dict[tuple[int, int], int]:
    """(dlq partition, offset) → times replayed."""
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(query("dlq_replayed"), {"dlq_topic": s.topic_dlq}).fetchall()
    return {(int(p), int(o)): int(n) for p, o, _at, n in rows}


def replay_letters(s: Settings, letters: list[Letter], *, reason: str) -> list[dict[str, Any]]:
    """Produce the letters back to their topics; record them once all are acknowledged."""
    copies = copies_of(s, letters)  # before anything is produced: all or none
    producer = Producer(
        {"bootstrap.servers": s.kafka_bootstrap, "acks": "all", "enable.idempotence": True}
    )
    # Where each letter's (first) copy landed; an SNS letter may become several records.
    landed: dict[str, tuple[int, int]] = {}
    errors: list[str] = []

    def recorder(ref: str) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(f"{ref}: {err}")
            elif ref not in landed:
                landed[ref] = (int(msg.partition()), int(msg.offset()))

        return on_delivery

    for copy in copies:
        if copy.partition is None:  # the partitioner, by key
            producer.produce(
                copy.topic,
                key=copy.key,
                value=copy.value,
                headers=copy.headers,
                on_delivery=recorder(copy.letter.ref),
            )
        else:
            producer.produce(
                copy.topic,
                key=copy.key,
                value=copy.value,
                partition=copy.partition,
                headers=copy.headers,
                on_delivery=recorder(copy.letter.ref),
            )
    remaining = producer.flush(30)
    if remaining or errors:
        raise FlashsendError(
            f"replay not acknowledged ({remaining} pending): {errors[:3]}; "
            "safe to run again (consumers deduplicate)"
        )
    replay_id = str(uuid.uuid4())
    who, host = operator(s)
    done = []
    with psycopg.connect(s.pg_dsn) as conn, conn.transaction():
        for letter in letters:
            partition, offset = landed[letter.ref]
            row = {
                "replay_id": replay_id,
                "requested_by": who,
                "host": host,
                "reason": reason,
                "dlq_topic": s.topic_dlq,
                "dlq_partition": letter.dlq_partition,
                "dlq_offset": letter.dlq_offset,
                "dead_reason": letter.reason,
                "target_topic": s.topic_mail_events if letter.from_sns else letter.topic,
                "target_partition": partition,
                "original_offset": letter.offset,
                "new_offset": offset,
            }
            conn.execute(query("insert_dlq_replay"), row)
            done.append(row)
    return done
