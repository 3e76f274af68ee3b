"""A row claimed again by the worker that still holds its old claim of it.

The row's lease ran out while it waited in its lane (the lane was suspended through a
rebalance, or slow), the lease sent it back to pending, and reconcile's doorbell brought it to
the same worker, which claimed it anew: its lane now holds two claims of one row, the stale one
ahead. Only the newest claim may enter a call, and each outcome is recorded under the claim it
is for: the row is texted once and its outcome recorded, never left `sending` by a live worker
(for the lease to turn it `unknown`). In-process sender (streams.app.Runtime) on the real
PostgreSQL and the SMS stand-in, handed the records Faust would deliver, as in
test_fence_campaign.py."""

from __future__ import annotations

import asyncio

import psycopg

from flashsend.lab.demo import SMS_BODY
from flashsend.settings import Settings
from producers.campaign import snapshot
from producers.campaign_ops import create_campaign
from sinks.queries import query
from sinks.users import fill_phones, seed_users
from streams.app import Runtime
from tests.integration.campaign_helpers import admin, sql
from tests.integration.fence_helpers import doorbells, take, until

USERS = 40


def _statuses(settings: Settings, cid: int, seqs: list[int]) -> dict[int, str]:
    found = sql(
        settings,
        "SELECT seq, status FROM campaign_recipients WHERE campaign_id = %s AND seq = ANY(%s)",
        cid,
        seqs,
    )
    return {int(seq): str(status) for seq, status in found}


def test_a_row_claimed_again_while_its_stale_claim_waits_is_texted_once_and_recorded(
    settings: Settings,
) -> None:
    """15 rows claimed: the lane holds a call of 10 and queues 5, suspended (a rebalance). All
    15 leases run out; 3 rows of the call and the 5 queued ones are claimed again. Resumed,
    the lane meets the stale claims first: the call of 10, then the 5 queued ones in one call
    with new claims, some of the same rows. The 8 rows are texted once each and end `sent`."""
    seed_users(settings.pg_dsn, USERS)
    fill_phones(settings.pg_dsn, USERS)
    cid = create_campaign(
        settings.model_copy(update={"sms_send_hours": ""}),  # whatever the hour
        name="claimed-again",
        template=SMS_BODY,
        channel="sms",
    )
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        snapshot(conn, cid, settings.audience_condition)
    pending = sql(
        settings,
        "SELECT seq, user_id FROM campaign_recipients WHERE campaign_id = %s "
        "AND status = 'pending' ORDER BY seq LIMIT 15",
        cid,
    )
    rows = [(int(seq), int(user)) for seq, user in pending]
    user_of = dict(rows)
    assert len(rows) == 15

    async def scenario() -> list[int]:
        runtime = Runtime(settings)
        try:
            sender = await runtime.ensure_started()
            assert runtime.store is not None
            await take(runtime.store, [0])
            await sender.reassign({0})
            lane = sender.lanes[0]
            await sender.suspend({0})  # a rebalance began: the lane starts no call
            await sender.handle(doorbells(settings, cid, rows, first_offset=0))
            assert await until(lambda: len(lane._inflight) == 10 and len(lane._rows) == 5, 10)
            in_call = [r.seq for r in lane._inflight]
            queued = [r.seq for r in lane._rows]
            with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
                expire = {"campaign_id": cid, "lease_s": 0}
                assert conn.execute(query("expire_leases"), expire).rowcount == 15
            again = in_call[:3] + queued
            await sender.handle(
                doorbells(settings, cid, [(s, user_of[s]) for s in again], first_offset=15)
            )
            assert await until(lambda: sender.stats["claimed"] == 15 + len(again), 10)
            await sender.reassign({0})  # the rebalance ended: the lane goes on
            await until(lambda: "sending" not in _statuses(settings, cid, again).values(), 10)
            return again
        finally:
            await runtime.stop()

    again = asyncio.run(scenario())
    after = _statuses(settings, cid, [seq for seq, _ in rows])
    texts = admin(settings).sms_stats(campaign=str(cid))
    once = {"accepted": len(again), "duplicates": 0}
    assert {seq: after[seq] for seq in again} == dict.fromkeys(again, "sent"), (after, texts)
    assert {k: texts[k] for k in once} == once, texts
    assert {after[seq] for seq in user_of if seq not in again} == {"pending"}, after
