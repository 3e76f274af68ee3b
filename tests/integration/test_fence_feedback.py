"""The feedback agent's offset fence (sinks/offsets.py through FeedbackStore.apply): bounces,
complaints and deliveries are never lost to the fence. The agent's handler runs in-process on
real PostgreSQL (two FeedbackIngests = two workers of one group); the recreated topic runs a
real `flashsend worker --role feedback` on the real broker."""

from __future__ import annotations

from pathlib import Path

import pytest
from psycopg_pool import AsyncConnectionPool

from flashsend import deliverability
from flashsend.lab.mail_bench import spawn_worker
from flashsend.settings import Settings
from producers.dlq import DeadLetterProducer
from producers.mail_topics import ensure_mail_topics
from sinks.feedback_store import FeedbackStore
from streams.feedback_ingest import FeedbackIngest
from tests.integration.feedback_helpers import (
    codec,
    delivered,
    deliveries,
    done_campaign,
    produce_events,
)
from tests.integration.fence_helpers import recreate_topic, stored_offsets, take
from tests.integration.mail_fixtures import open_pool, run, stop_process, wait_for


def _ingest(settings: Settings, pool: AsyncConnectionPool) -> FeedbackIngest:
    store = FeedbackStore(
        pool,
        group_id=deliverability.feedback_app_id(settings),
        topic=settings.topic_mail_events,
        thresholds=deliverability.thresholds(settings),
    )
    return FeedbackIngest(
        store=store,
        ses_codec=codec(settings, "ses_event"),
        unsubscribed_codec=codec(settings, "unsubscribed"),
        dlq=DeadLetterProducer(settings.kafka_bootstrap, settings.topic_dlq),
    )


def _offset(settings: Settings) -> int:
    group = deliverability.feedback_app_id(settings)
    return stored_offsets(settings, group, settings.topic_mail_events).get(0, 0)


def test_a_batch_overlapping_the_stored_offset_applies_every_record_past_it(
    settings: Settings,
) -> None:
    """The old owner applied offsets 100-149; the new owner is handed 100-130 and 131-199.
    Records below 150 are skipped one by one, 150-199 are counted. The old fence dropped
    both batches whole: 50 deliveries (bounces, complaints alike) were lost for good."""
    cid = done_campaign(settings)
    records = deliveries(settings, cid, 100, first_offset=100)

    async def scenario() -> tuple[int, int]:
        pool = await open_pool(settings)
        try:
            old, new = _ingest(settings, pool), _ingest(settings, pool)
            await take(old.store, [0])
            await old.handle(records[:50])
            await take(new.store, [0])  # the partition moves: a newer epoch
            await new.handle(records[:31])
            await new.handle(records[31:])
            return new.stats["applied"], new.stats["fenced"]
        finally:
            await pool.close()

    applied, fenced = run(scenario())
    assert delivered(settings, cid) == 100
    assert (applied, fenced) == (50, 50)
    assert _offset(settings) == 200


@pytest.mark.parametrize("where", ["ahead", "behind"])
def test_a_zombie_applies_nothing_and_leaves_the_offset(settings: Settings, where: str) -> None:
    """Worker Z lost partition 0 to worker O (a newer epoch) without knowing yet. Ahead of O,
    or behind then ahead of it, Z counts nothing and does not move the offset; O then applies
    every event. The old fence let Z apply (and advance past) what O had not reached."""
    cid = done_campaign(settings)
    records = deliveries(settings, cid, 150, first_offset=0)

    async def scenario() -> tuple[int, int, int, int]:
        pool = await open_pool(settings)
        try:
            zombie, owner = _ingest(settings, pool), _ingest(settings, pool)
            await take(zombie.store, [0])
            await take(owner.store, [0])
            if where == "behind":
                await owner.handle(records[:100])
                before = _offset(settings)
                await zombie.handle(records[:50])
                await zombie.handle(records[100:])
                rest = records[100:]
            else:
                before = _offset(settings)
                await zombie.handle(records[50:])
                rest = records
            after = _offset(settings)
            await owner.handle(rest)
            return zombie.stats["applied"], zombie.stats["overtaken"], before, after
        finally:
            await pool.close()

    zombie_applied, overtaken, before, after = run(scenario())
    assert zombie_applied == 0
    assert after == before
    assert overtaken >= 1
    assert delivered(settings, cid) == 150


def test_a_recreated_topic_is_consumed_from_its_start(settings: Settings, tmp_path: Path) -> None:
    """A feedback worker consumes 30 events; mail.events is deleted and created again (offsets
    start at 0 again) and 10 new events arrive. The next worker sees the new topic id, logs it
    and starts at the log start: all 10 are counted. The old fence skipped them for good."""
    ensure_mail_topics(settings)
    cid = done_campaign(settings)
    produce_events(settings, deliveries(settings, cid, 30, first_offset=0))
    worker = spawn_worker(settings, "feedback", tmp_path)
    try:
        wait_for("first events applied", lambda: delivered(settings, cid) == 30, 60)
        wait_for("offset stored", lambda: _offset(settings) == 30, 30)
    finally:
        stop_process(worker)
    recreate_topic(
        settings,
        settings.topic_mail_events,
        settings.order_events_partitions,
        lambda: ensure_mail_topics(settings),
    )
    produce_events(settings, deliveries(settings, cid, 10, first_offset=0))
    worker = spawn_worker(settings, "feedback", tmp_path)
    try:
        wait_for("events of the new topic applied", lambda: delivered(settings, cid) == 40, 60)
    finally:
        stop_process(worker)
    log = (tmp_path / "feedback-worker.log").read_text(errors="replace")
    assert "topic recreated" in log
