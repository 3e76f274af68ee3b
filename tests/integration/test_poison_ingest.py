"""Poison never blocks the mail service's partition, against real PostgreSQL and Kafka.

The ingest runs in-process (MailIngest.handle, the Faust agent's handler) on a real database
with the real DLQ producer. After every batch the stored offset of the partition is past the
batch's last record: nothing is retried forever, nothing crashes.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flashsend import deliverability
from flashsend.settings import Settings
from producers.dlq import DeadLetterProducer
from producers.dlq_replay import read_letters
from producers.ses_events import event_id
from producers.topics import ensure_topics
from schemas.serde import AvroCodec, registry_client
from sinks.feedback_store import FeedbackStore
from streams.feedback_ingest import SCHEMA_HEADER, FeedbackIngest
from streams.mail_ingest import MailIngest
from tests.conftest import LocalStack
from tests.integration.fence_helpers import Consumed, stored_offsets, take
from tests.integration.mail_fixtures import (
    address,
    mail_settings,
    open_pool,
    order_codec,
    order_event,
    store_for,
)
from tests.unit.test_poison_properties import ORDER_DOMAINS, damaged, records


@pytest.fixture(scope="module")
def ms(stack: LocalStack) -> Settings:
    s = mail_settings(stack)
    ensure_topics(s.kafka_bootstrap, {s.topic_order_events: 1, s.topic_dlq: 1})
    return s


def _ingest(s: Settings, pool: object) -> MailIngest:
    return MailIngest(
        store=store_for(s, pool),  # type: ignore[arg-type]
        codec=order_codec(s),
        dlq=DeadLetterProducer(s.kafka_bootstrap, s.topic_dlq),
        max_age_s=s.mail_event_max_age_s,
        at_most_once_templates=s.mail_at_most_once_templates,
        retry_cap_s=0.2,
    )


def _offset(s: Settings) -> int:
    return stored_offsets(s, s.group_mail, s.topic_order_events).get(0, 0)


def test_a_record_postgresql_refuses_is_dead_lettered_and_the_rest_applied(
    ms: Settings,
) -> None:
    """A value the field checks did not foresee, refused by PostgreSQL itself (here a CHECK
    constraint added to this test's database): the batch is applied again record by record,
    the refused record goes to the DLQ as rejected_by_database, the two around it become mail
    rows and the offset moves past all three. Naive version: every data error was 'database
    unavailable', retried forever (the partition stuck; here the 30 s timeout)."""
    refused_to = f"refused-{uuid.uuid4().hex[:6]}@example.com"
    with psycopg.connect(ms.pg_dsn) as conn:
        conn.execute(f"ALTER TABLE mail ADD CONSTRAINT t_refuse CHECK (to_email <> '{refused_to}')")
    codec = order_codec(ms)
    start = _offset(ms)
    base = uuid.uuid4().int % 10**8
    events = [
        order_event("OrderConfirmed", base, email=address()),
        order_event("OrderConfirmed", base + 1, email=refused_to),
        order_event("OrderConfirmed", base + 2, email=address()),
    ]
    batch = [
        Consumed(ms.topic_order_events, 0, start + i, b"k", codec.encode(e))
        for i, e in enumerate(events)
    ]

    async def scenario() -> MailIngest:
        pool = await open_pool(ms)
        try:
            ingest = _ingest(ms, pool)
            await take(ingest.store, [0])
            await asyncio.wait_for(ingest.handle(batch), 30)
            return ingest
        finally:
            await pool.close()

    try:
        ingest = asyncio.run(scenario())
    finally:
        with psycopg.connect(ms.pg_dsn) as conn:
            conn.execute("ALTER TABLE mail DROP CONSTRAINT t_refuse")
    assert (ingest.stats.created, ingest.stats.dead, ingest.stats.one_by_one) == (2, 1, 1)
    with psycopg.connect(ms.pg_dsn) as conn:
        keys = [
            r[0]
            for r in conn.execute(
                "SELECT dedupe_key FROM mail WHERE ref = ANY(%s)",
                ([str(base + i) for i in range(3)],),
            )
        ]
    assert sorted(keys) == [f"order-confirmed:{base}", f"order-confirmed:{base + 2}"]
    assert _offset(ms) == start + 3
    letters = [x for x in read_letters(ms) if x.offset == start + 1]
    assert [x.reason for x in letters] == ["rejected_by_database"]


@settings(
    max_examples=15,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_generated_batches_never_stop_the_partition(ms: Settings, data: st.DataObject) -> None:
    """Batches of order events with fields at the edges of their domains (the unit
    properties' strategies) and damaged bytes: each batch is committed — rows or dead letters
    — and the stored offset moves past its last record."""
    codec = order_codec(ms)
    fields = sorted(ORDER_DOMAINS[1])
    values = [
        data.draw(damaged(codec.encode(data.draw(records(ORDER_DOMAINS, field)))))
        for field in data.draw(st.lists(st.sampled_from(fields), min_size=1, max_size=8))
    ]
    start = _offset(ms)
    batch = [Consumed(ms.topic_order_events, 0, start + i, b"k", v) for i, v in enumerate(values)]

    async def scenario() -> None:
        pool = await open_pool(ms)
        try:
            ingest = _ingest(ms, pool)
            await take(ingest.store, [0])
            await asyncio.wait_for(ingest.handle(batch), 30)
        finally:
            await pool.close()

    asyncio.run(scenario())
    assert _offset(ms) == start + len(batch)


def test_a_feedback_record_postgresql_refuses_is_dead_lettered_and_the_rest_applied(
    settings: Settings,
) -> None:
    """The feedback agent's ingest, same rule: three permanent bounces in one batch, the
    middle one's suppression refused by PostgreSQL (a CHECK added in this test's database):
    the other two addresses are suppressed, the refused record is dead-lettered as
    rejected_by_database, and the offset moves past all three. Naive version: retried
    forever, no bounce of the batch ever suppressed."""
    s = settings
    ensure_topics(s.kafka_bootstrap, {s.topic_mail_events: 1, s.topic_dlq: 1})
    refused = f"refused-{uuid.uuid4().hex[:6]}@x.test"
    addresses = [f"b-{uuid.uuid4().hex[:8]}@x.test", refused, f"b-{uuid.uuid4().hex[:8]}@x.test"]
    with psycopg.connect(s.pg_dsn) as conn:
        conn.execute(
            f"ALTER TABLE email_suppressions ADD CONSTRAINT t_refuse CHECK (email <> '{refused}')"
        )
    ses = AvroCodec(registry_client(s.schema_registry_url), "ses_event")
    unsubscribed = AvroCodec(registry_client(s.schema_registry_url), "unsubscribed")
    batch = []
    for i, to in enumerate(addresses):
        message_id = f"ses-{uuid.uuid4()}"
        record = {
            "event_id": event_id(message_id, "Bounce", to),
            "event_type": "Bounce",
            "version": 1,
            "occurred_at": int(time.time() * 1000),
            "recipient": to,
            "ses_message_id": message_id,
            "sns_message_id": str(uuid.uuid4()),
            "bounce_type": "Permanent",
            "source": "event_publishing",
            "received_at": int(time.time() * 1000),
        }
        batch.append(
            Consumed(
                s.topic_mail_events,
                0,
                i,
                to.encode(),
                ses.encode(record),
                ((SCHEMA_HEADER, b"ses_event"),),
            )
        )

    async def scenario() -> FeedbackIngest:
        pool = await open_pool(s)
        try:
            ingest = FeedbackIngest(
                store=FeedbackStore(
                    pool,
                    group_id=deliverability.feedback_app_id(s),
                    topic=s.topic_mail_events,
                    thresholds=deliverability.thresholds(s),
                ),
                ses_codec=ses,
                unsubscribed_codec=unsubscribed,
                dlq=DeadLetterProducer(s.kafka_bootstrap, s.topic_dlq),
                retry_cap_s=0.2,
            )
            await take(ingest.store, [0])
            await asyncio.wait_for(ingest.handle(batch), 30)
            return ingest
        finally:
            await pool.close()

    ingest = asyncio.run(scenario())
    with psycopg.connect(s.pg_dsn) as conn:
        suppressed = {r[0] for r in conn.execute("SELECT email FROM email_suppressions")}
    assert suppressed == {addresses[0], addresses[2]}
    assert (ingest.stats["dead"], ingest.stats["one_by_one"]) == (1, 1)
    group = deliverability.feedback_app_id(s)
    assert stored_offsets(s, group, s.topic_mail_events).get(0) == 3
    assert [x.reason for x in read_letters(s)] == ["rejected_by_database"]
