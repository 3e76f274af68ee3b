"""The mail service's offset fence (sinks/offsets.py through MailStore.ingest): order events
are never lost to the fence. The ingest runs in-process on real PostgreSQL (two MailIngests =
two workers of one group); the recreated topic runs a real `flashsend worker --role mail` on
the real broker."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest

from flashsend.settings import Settings
from producers.dlq import DeadLetterProducer
from producers.mail_topics import ensure_mail_topics
from streams.mail_ingest import IngestStats, MailIngest
from tests.conftest import LocalStack
from tests.integration.fence_helpers import Consumed, recreate_topic, stored_offsets, take
from tests.integration.mail_fixtures import (
    address,
    mail_settings,
    open_pool,
    order_codec,
    order_event,
    produce,
    put_templates,
    run,
    start_mail_worker,
    stop_process,
    store_for,
    wait_for,
)


@pytest.fixture
def ms(stack: LocalStack) -> Settings:
    return mail_settings(stack)


def _orders(settings: Settings, count: int, first_offset: int) -> tuple[list[str], list[Consumed]]:
    """`count` OrderConfirmed events on partition 0 from `first_offset` on, and their keys."""
    codec = order_codec(settings)
    keys: list[str] = []
    records: list[Consumed] = []
    base = uuid.uuid4().int % 10**8 * 1000
    for i in range(count):
        event = order_event("OrderConfirmed", base + i, email=address())
        keys.append(event["dedupe_key"])
        records.append(
            Consumed(
                settings.topic_order_events,
                0,
                first_offset + i,
                str(base + i).encode(),
                codec.encode(event),
            )
        )
    return keys, records


def _ingest(settings: Settings, pool: object) -> MailIngest:
    return MailIngest(
        store=store_for(settings, pool),  # type: ignore[arg-type]
        codec=order_codec(settings),
        dlq=DeadLetterProducer(settings.kafka_bootstrap, settings.topic_dlq),
        max_age_s=settings.mail_event_max_age_s,
        at_most_once_templates=settings.mail_at_most_once_templates,
    )


def _created(settings: Settings, keys: list[str]) -> int:
    with psycopg.connect(settings.pg_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM mail WHERE dedupe_key = ANY(%s)", (keys,))
        return int(row.fetchone()[0])  # type: ignore[index]


def _offset(settings: Settings) -> int:
    return stored_offsets(settings, settings.group_mail, settings.topic_order_events)[0]


def test_a_batch_overlapping_the_stored_offset_applies_every_record_past_it(ms: Settings) -> None:
    """The old owner applied offsets 100-149; the new owner is handed 100-130 and 131-199.
    Records below 150 are skipped one by one, 150-199 become mail rows. The old fence
    dropped both batches whole: 50 order mails were lost for good."""
    keys, records = _orders(ms, 100, first_offset=100)

    async def scenario() -> tuple[int, int]:
        pool = await open_pool(ms)
        try:
            old, new = _ingest(ms, pool), _ingest(ms, pool)
            await take(old.store, [0])
            await old.handle(records[:50])
            await take(new.store, [0])  # the partition moves: a newer epoch
            await new.handle(records[:31])
            await new.handle(records[31:])
            return new.stats.created, new.stats.fenced
        finally:
            await pool.close()

    created, fenced = run(scenario())
    assert _created(ms, keys) == 100
    assert (created, fenced) == (50, 50)
    assert _offset(ms) == 200


@pytest.mark.parametrize("where", ["ahead", "behind"])
def test_a_zombie_applies_nothing_and_leaves_the_offset(ms: Settings, where: str) -> None:
    """Worker Z lost partition 0 to worker O (a newer epoch) without knowing yet. Ahead of O,
    or behind then ahead of it, Z inserts no mail row and does not move the offset; O then
    applies every event. The old fence let Z apply (and advance past) what O had not
    reached."""
    keys, records = _orders(ms, 150, first_offset=0)

    async def scenario() -> tuple[IngestStats, int, int]:
        pool = await open_pool(ms)
        try:
            zombie, owner = _ingest(ms, pool), _ingest(ms, pool)
            await take(zombie.store, [0])
            await take(owner.store, [0])
            if where == "behind":
                await owner.handle(records[:100])
                before = _offset(ms)
                await zombie.handle(records[:50])
                await zombie.handle(records[100:])
                rest = records[100:]
            else:
                before = _offset(ms)
                await zombie.handle(records[50:])
                rest = records
            after = _offset(ms)
            await owner.handle(rest)
            return zombie.stats, before, after
        finally:
            await pool.close()

    zombie_stats, before, after = run(scenario())
    assert zombie_stats.created == 0
    assert after == before
    assert zombie_stats.overtaken >= 1
    assert _created(ms, keys) == 150


def test_a_recreated_topic_is_consumed_from_its_start(ms: Settings, tmp_path: Path) -> None:
    """A mail worker consumes 30 order events; order.events is deleted and created again
    (offsets start at 0 again) and 10 new events arrive. The next worker sees the new topic
    id, logs it and starts at the log start: all 10 become mail rows. The old fence skipped
    them for good (stored offset 30 above all of them)."""
    put_templates(ms)
    ensure_mail_topics(ms)
    first_keys, first = _orders(ms, 30, first_offset=0)
    produce(ms, [(r.key or b"", r.value or b"") for r in first])
    worker = start_mail_worker(ms, tmp_path)
    try:
        wait_for("first events applied", lambda: _created(ms, first_keys) == 30, 60)
        wait_for("offset stored", lambda: _offset(ms) == 30, 30)
    finally:
        stop_process(worker)
    recreate_topic(
        ms, ms.topic_order_events, ms.order_events_partitions, lambda: ensure_mail_topics(ms)
    )
    second_keys, second = _orders(ms, 10, first_offset=0)
    produce(ms, [(r.key or b"", r.value or b"") for r in second])
    worker = start_mail_worker(ms, tmp_path)
    try:
        wait_for("events of the new topic applied", lambda: _created(ms, second_keys) == 10, 60)
    finally:
        stop_process(worker)
    log = (tmp_path / "mail-worker.log").read_text(errors="replace")
    assert "topic recreated" in log
