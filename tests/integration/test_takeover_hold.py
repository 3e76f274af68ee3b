"""When a campaign's rows became sendable, as a worker's campaign cache knows it: the new owner
of a partition holds a campaign's first second only if the previous owner could have sent it
(streams/rules/throttle.takeover_hold_until), so the estimate must never come out later than the
truth, and the start must reach every cache at once (NOTIFY), not at the next poll."""

from __future__ import annotations

import asyncio
import time

import psycopg
from psycopg_pool import AsyncConnectionPool

from flashsend.settings import Settings
from producers.campaign import snapshot
from sinks.recipient_store import RecipientStore
from sinks.users import seed_users
from streams.campaign_state import POLL_INTERVAL_S, CampaignCache
from tests.integration.campaign_helpers import new_campaign, sending_campaign
from tests.integration.mail_fixtures import open_pool, run

GROUP = "takeover-hold"


def _cache(pool: AsyncConnectionPool, interval: float = POLL_INTERVAL_S) -> CampaignCache:
    return CampaignCache(RecipientStore(pool, group_id=GROUP, topic="t-takeover"), interval)


async def _sendable_since(settings: Settings, ids: list[int]) -> dict[int, float | None]:
    pool = await open_pool(settings, size=2)
    try:
        cache = _cache(pool)
        await cache.refresh()
        return {cid: cache.sendable_since(cid) for cid in ids}
    finally:
        await pool.close()


def test_the_estimate_is_never_later_than_the_snapshot_and_orders_against_an_assignment(
    settings: Settings,
) -> None:
    before = sending_campaign(settings, users=50)
    assigned_at = time.monotonic()  # a worker's assignment, between the two snapshots
    time.sleep(0.05)
    after = sending_campaign(settings, users=50)
    returned_at = time.monotonic()  # the second snapshot committed before this instant
    draft = new_campaign(settings)
    since = run(_sendable_since(settings, [before, after, draft]))
    first, second = since[before], since[after]
    assert first is not None and first <= assigned_at
    assert second is not None and assigned_at < second <= returned_at
    assert since[draft] is None  # not sendable yet: unknown, so a new owner would hold it


def test_the_end_of_the_snapshot_is_notified_to_every_cache(settings: Settings) -> None:
    seed_users(settings.pg_dsn, 50)
    cid = new_campaign(settings)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as listener:
        listener.execute("LISTEN flashsend_campaigns")
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            snapshot(conn, cid, settings.audience_condition)
        heard = [n.payload for n in listener.notifies(timeout=5.0, stop_after=1)]
    assert heard == [str(cid)]


def test_a_cache_sees_a_started_campaign_within_milliseconds_not_a_poll(
    settings: Settings,
) -> None:
    """The cache's poll is set to 30 s here: only the NOTIFY can bring the start in time."""
    seed_users(settings.pg_dsn, 50)
    cid = new_campaign(settings)

    async def scenario() -> float:
        pool = await open_pool(settings, size=3)
        cache = _cache(pool, 30.0)
        cache.start()
        try:
            await asyncio.sleep(0.5)  # the first refresh and the LISTEN are in place
            began = time.monotonic()
            with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
                await asyncio.to_thread(snapshot, conn, cid, settings.audience_condition)
            while not cache.is_sending(cid):
                if time.monotonic() - began > 5.0:
                    raise AssertionError("the cache did not see the campaign start")
                await asyncio.sleep(0.005)
            return time.monotonic() - began
        finally:
            await cache.stop()
            await pool.close()

    assert run(scenario()) < 5.0
