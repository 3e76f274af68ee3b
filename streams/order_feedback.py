"""The demo order service's consumer of mail.events (`flashsend worker --role orders`).

Lifecycle events arrive at least once and possibly out of order (two relays' worth of
reordering, redeliveries). `apply_mail_event` is idempotent and compares occurred_at, so the
consumer needs no inbox table. The broker offset is committed only AFTER the database commit
(seed architecture-2 trap 1: never acknowledge before the effect is durable); a crash in
between replays a few events, which change nothing the second time.

mail.events is shared with the SES feedback path (bounces, complaints): records whose
`flashsend.schema` header is not `mail_lifecycle` are not ours and are skipped; ours that
cannot be decoded go to the DLQ.
"""

from __future__ import annotations

import logging
import random
import threading
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import Consumer, Message

from flashsend.settings import Settings
from producers.dlq import DeadLetter, DeadLetterProducer, record_headers
from schemas import serde
from schemas.serde import RegistryUnavailable, SerdeError
from sinks.order_store import MailEvent, apply_mail_event
from streams.rules.backoff import backoff_delay

log = logging.getLogger("flashsend.orders.feedback")

SCHEMA = "mail_lifecycle"


@dataclass
class FeedbackStats:
    applied: int = 0
    unchanged: int = 0
    skipped: int = 0
    dead: int = 0


def _header(msg: Message, name: str) -> str | None:
    headers: Any = msg.headers() or []
    for key, value in headers:
        if key == name and value is not None:
            return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
    return None


class OrderFeedback:
    def __init__(self, settings: Settings, *, dsn: str | None = None) -> None:
        self.settings = settings
        self.dsn = dsn or settings.orders_pg_dsn
        self.codec = serde.codec(settings, SCHEMA)
        self.dlq = DeadLetterProducer(settings.kafka_bootstrap, settings.topic_dlq)
        self.consumer = Consumer(
            {
                "bootstrap.servers": settings.kafka_bootstrap,
                "group.id": settings.group_orders,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        self.consumer.subscribe([settings.topic_mail_events])
        self.stats = FeedbackStats()
        self.rng = random.Random()
        self._conn: psycopg.Connection[Any] | None = None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn)
        return self._conn

    def poll_once(self, timeout: float = 0.5) -> int:
        msgs = [m for m in self.consumer.consume(200, timeout) if m.error() is None]
        if not msgs:
            return 0
        self._wait_for_writer_schemas([m.value() for m in msgs])
        events: list[MailEvent] = []
        dead: list[DeadLetter] = []
        for msg in msgs:
            if _header(msg, "flashsend.schema") != SCHEMA:
                self.stats.skipped += 1
                continue
            try:
                events.append(MailEvent.from_record(self.codec.decode(msg.value())))
            except Exception as exc:  # poison, whatever the error: never replayed forever
                reason = exc.reason if isinstance(exc, SerdeError) else "bad_record"
                dead.append(
                    DeadLetter(
                        msg.topic() or "",
                        msg.partition() or 0,
                        msg.offset() or 0,
                        msg.key(),
                        msg.value(),
                        reason,
                        str(exc),
                        record_headers(msg.headers()),
                    )
                )
        if dead:
            self.dlq.publish_blocking(dead)
            self.stats.dead += len(dead)
        self._apply(events)
        self.consumer.commit(asynchronous=False)  # only after the database commit
        return len(msgs)

    def _wait_for_writer_schemas(self, values: list[bytes | None]) -> None:
        """Look up writer schemas not cached yet; a registry that does not answer is waited
        out with backoff (its outage must not dead-letter good records)."""
        attempt = 0
        for schema_id in sorted(self.codec.missing_writer_ids(values)):
            while True:
                try:
                    self.codec.load_writer(schema_id)
                    break
                except RegistryUnavailable as exc:
                    attempt += 1
                    delay = backoff_delay(min(attempt, 8), base=0.2, cap=5.0, rng=self.rng)
                    log.warning("schema registry unavailable (%s); retrying in %.1fs", exc, delay)
                    threading.Event().wait(delay)

    def _apply(self, events: list[MailEvent]) -> None:
        attempt = 0
        while True:
            try:
                conn = self._connection()
                with conn.transaction():
                    changed = [apply_mail_event(conn, e) for e in events]
                self.stats.applied += sum(changed)
                self.stats.unchanged += len(changed) - sum(changed)
                return
            except psycopg.OperationalError as exc:  # database down: retry, do not commit
                attempt += 1
                delay = backoff_delay(min(attempt, 8), base=0.2, cap=5.0, rng=self.rng)
                log.warning("order database unavailable (%s); retrying in %.1fs", exc, delay)
                if self._conn is not None:
                    self._conn.close()
                threading.Event().wait(delay)

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                self.poll_once(0.5)
        finally:
            self.close()

    def close(self) -> None:
        self.consumer.close()
        if self._conn is not None:
            self._conn.close()
