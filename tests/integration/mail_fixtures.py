"""Helpers for the transactional-mail tests: databases, services, producing order events.

Each environment gets flashsend's database cloned from the migrated template (the mail
service's database), its own order-service database, and its own topics and groups.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer
from psycopg_pool import AsyncConnectionPool

from flashsend.lab.mail_bench import spawn_worker
from flashsend.settings import Settings
from infra.migrate import apply_migrations
from infra.orders_db import ORDERS_MIGRATIONS
from infra.process import terminate
from infra.ses_standin.admin import SesStandinAdmin
from producers.mail_topics import ensure_mail_topics
from producers.outbox_relay import OutboxRelay
from schemas.serde import AvroCodec, registry_client
from sinks.mail_store import MailStore
from sinks.ses import SesSender, make_client
from streams.mail_app import ensure_templates, relay_config
from tests.conftest import TEMPLATE_DB, LocalStack


def mail_settings(stack: LocalStack, **overrides: Any) -> Settings:
    suffix = uuid.uuid4().hex[:10]
    database = f"m_{suffix}"
    orders_db = f"o_{suffix}"
    stack.postgres.create_database(database, template=TEMPLATE_DB)
    stack.postgres.create_database(orders_db)
    orders_dsn = stack.settings.pg_dsn_for(orders_db)
    apply_migrations(orders_dsn, ORDERS_MIGRATIONS)
    values: dict[str, Any] = {
        "pg_database": database,
        "pg_dsn": stack.settings.pg_dsn_for(database),
        "orders_database": orders_db,
        "orders_pg_dsn": orders_dsn,
        "topic_recipients": f"recipients-{suffix}",
        "topic_mail_events": f"mail-events-{suffix}",
        "topic_order_events": f"order-events-{suffix}",
        "topic_dlq": f"dlq-{suffix}",
        "group_sender": f"sender-{suffix}",
        "group_mail": f"mail-{suffix}",
        "group_orders": f"orders-{suffix}",
        "app_id": f"flashsend-{suffix}",
        "mail_app_id": f"flashsend-mail-{suffix}",
        "order_events_partitions": 2,
        "mail_poll_s": 0.3,
        "relay_poll_s": 0.2,
        "mail_retry_base_s": 0.1,
        "mail_retry_cap_s": 0.5,
    }
    values.update(overrides)
    # Campaign ids are SES tags and the stand-in is shared by the session (see conftest).
    with psycopg.connect(values["pg_dsn"], autocommit=True) as conn:
        conn.execute(
            f"ALTER SEQUENCE campaigns_id_seq RESTART WITH {random.randrange(10**9, 2 * 10**9)}"
        )
    return stack.settings_for(**values)


def admin(settings: Settings) -> SesStandinAdmin:
    assert settings.ses_endpoint_url
    return SesStandinAdmin(settings.ses_endpoint_url)


def address(tag: str = "c") -> str:
    return f"{tag}-{uuid.uuid4().hex[:12]}@shop.flashsend.test"


def provider_messages(settings: Settings, to: str) -> list[dict[str, Any]]:
    return admin(settings).messages(destination=to, limit=100)


def put_templates(settings: Settings) -> None:
    ensure_templates(SesSender(make_client(settings, timeout=10)))


@contextmanager
def faults(settings: Settings, **changes: float | bool) -> Iterator[None]:
    """Stand-in faults for the duration of a block (the stand-in is shared by the session)."""
    ses = admin(settings)
    before: dict[str, Any] = dict(ses.faults())
    ses.set_faults(**changes)
    try:
        yield
    finally:
        ses.set_faults(**{k: before[k] for k in changes})


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def mail_row(settings: Settings, dedupe_key: str) -> dict[str, Any] | None:
    with psycopg.connect(settings.pg_dsn) as conn:
        cur = conn.execute("SELECT * FROM mail WHERE dedupe_key = %s", (dedupe_key,))
        row = cur.fetchone()
        if row is None:
            return None
        assert cur.description is not None
        return dict(zip([c.name for c in cur.description], row, strict=True))


def lifecycle(settings: Settings, dedupe_key: str) -> list[str]:
    with psycopg.connect(settings.pg_dsn) as conn:
        rows = conn.execute(
            "SELECT event_type FROM mail_outbox WHERE dedupe_key = %s ORDER BY id", (dedupe_key,)
        ).fetchall()
    return [r[0] for r in rows]


def store_for(settings: Settings, pool: AsyncConnectionPool) -> MailStore:
    return MailStore(
        pool,
        group_id=settings.group_mail,
        topic=settings.topic_order_events,
        lifecycle_topic=settings.topic_mail_events,
        suppression_exempt=settings.mail_suppression_exempt_templates,
    )


async def open_pool(settings: Settings, size: int = 6) -> AsyncConnectionPool:
    pool = AsyncConnectionPool(
        settings.pg_dsn, min_size=1, max_size=size, open=False, kwargs={"autocommit": True}
    )
    await pool.open(wait=True, timeout=30)
    return pool


def run(coro: Any) -> Any:
    return asyncio.run(coro)


# ---- Kafka -------------------------------------------------------------------------------


def order_codec(settings: Settings) -> AvroCodec:
    return AvroCodec(registry_client(settings.schema_registry_url), "order_event")


def order_event(event_type: str, order_id: int, **fields: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "event_id": str(uuid.uuid4()),
        "event_type": event_type,
        "version": 1,
        "occurred_at": int(time.time() * 1000),
        "dedupe_key": f"order-{'confirmed' if event_type == 'OrderConfirmed' else 'cancelled'}"
        f":{order_id}",
        "order_id": order_id,
        "email": None,
        "customer_name": "Lan",
        "locale": "vi",
        "total": "1250000",
        "currency": "VND",
        "items": [],
        "send_after": None,
        "template": None,
        "reason": None,
    }
    record.update(fields)
    return record


def produce(settings: Settings, values: list[tuple[bytes, bytes]], partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "acks": "all"})
    for key, value in values:
        producer.produce(settings.topic_order_events, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0


def read_topic(settings: Settings, topic: str, expect: int, timeout: float = 20.0) -> list[Any]:
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    found: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(found) < expect and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                found.append(msg)
        # a little longer, to catch anything beyond what we expected
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                found.append(msg)
    finally:
        consumer.close()
    return found


# ---- running services ---------------------------------------------------------------------


class Background:
    """A relay or consumer loop run in a thread of the test process (our real code)."""

    def __init__(self, target: Callable[[threading.Event], None], name: str) -> None:
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=target, args=(self.stop_event,), name=name)
        self.thread.daemon = True
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(30)


def order_relay(settings: Settings, **overrides: Any) -> OutboxRelay:
    config = relay_config(settings, "outbox", "outbox")
    if overrides:
        from dataclasses import replace

        config = replace(config, **overrides)
    return OutboxRelay(settings.orders_pg_dsn, config)


def start_mail_worker(
    settings: Settings, log_dir: Path, role: str = "mail"
) -> subprocess.Popen[bytes]:
    return spawn_worker(settings, role, log_dir)


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        terminate(proc.pid, timeout=20)
    proc.wait(timeout=10)


def prepare_topics(settings: Settings) -> None:
    ensure_mail_topics(settings)
