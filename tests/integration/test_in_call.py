"""Only rows whose SES call started can be in doubt, and a row is re-checked right before its
call: the claim's `attempts` is its token in enter_call and record_results, and the lease sends
rows that never entered a call back to pending (sinks/sql/recipients.sql)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import psycopg
from psycopg.rows import dict_row

from flashsend.settings import Settings
from sinks.offsets import Assignment, PartitionSpan
from sinks.queries import query
from sinks.recipient_store import (
    CampaignNotSending,
    ClaimedRecipient,
    RecipientStore,
    RowResult,
)
from tests.integration.campaign_helpers import pending_seqs, sending_campaign
from tests.integration.mail_fixtures import open_pool, run

GROUP = "in-call"


def rows(settings: Settings, cid: int, seqs: list[int]) -> dict[int, dict[str, Any]]:
    with psycopg.connect(settings.pg_dsn, autocommit=True, row_factory=dict_row) as conn:
        found = conn.execute(
            "SELECT seq, status, reason, attempts, in_call_at, requeue FROM campaign_recipients"
            " WHERE campaign_id = %s AND seq = ANY(%s)",
            (cid, seqs),
        ).fetchall()
    return {r["seq"]: r for r in found}


def expire_all_leases(settings: Settings, cid: int) -> int:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return conn.execute(query("expire_leases"), {"campaign_id": cid, "lease_s": 0}).rowcount


async def claim(store: RecipientStore, cid: int, seqs: list[int], offset: int) -> list[Any]:
    await store.offsets.take(Assignment.of(store.topic, [0]))
    outcome = await store.claim_batch(
        [PartitionSpan(0, offset, offset)], {0: [(offset, (cid, seq)) for seq in seqs]}
    )
    return list(outcome.claimed)


def test_lease_returns_rows_never_in_a_call_and_the_old_claim_cannot_send_them(
    settings: Settings,
) -> None:
    cid = sending_campaign(settings)
    seqs = pending_seqs(settings, cid)[:10]

    async def scenario() -> tuple[list[ClaimedRecipient], set[int], set[int], int]:
        pool = await open_pool(settings, size=2)
        try:
            store = RecipientStore(pool, group_id=GROUP, topic=f"t{cid}")
            claimed = await claim(store, cid, seqs, 0)
            entered, skipped = await store.enter_call(cid, claimed[:4])
            expire_all_leases(settings, cid)  # the worker "stalled": nothing recorded
            # The rows that never entered a call went back to pending and another claim took
            # them: under the old claim they may not enter a call, nor be released.
            again = await claim(store, cid, [r.seq for r in claimed[4:]], 1)
            late, _ = await store.enter_call(cid, claimed[4:])
            await store.record_results(
                cid,
                [RowResult(r.seq, "pending", "rebalanced", None) for r in claimed[4:6]],
                [r.attempt for r in claimed[4:6]],
            )
            return again, entered, late, skipped
        finally:
            await pool.close()

    again, entered, late, skipped = run(scenario())
    assert len(entered) == 4 and skipped == 0 and late == set()
    after = rows(settings, cid, seqs)
    for seq in entered:
        assert (after[seq]["status"], after[seq]["reason"]) == ("unknown", "lease_expired")
    # claimed again under a new token: a second claim, not the released one's
    assert sorted(r.seq for r in again) == sorted(set(seqs) - entered)
    assert all(r.attempt == 2 for r in again)
    for r in again:
        assert after[r.seq]["status"] == "sending" and after[r.seq]["in_call_at"] is None


def test_a_user_who_opts_out_or_is_suppressed_while_waiting_is_not_mailed(
    settings: Settings,
) -> None:
    cid = sending_campaign(settings)
    seqs = pending_seqs(settings, cid)[:6]

    async def scenario() -> tuple[set[int], int, list[ClaimedRecipient]]:
        pool = await open_pool(settings, size=2)
        try:
            store = RecipientStore(pool, group_id=GROUP, topic=f"t{cid}")
            claimed = await claim(store, cid, seqs, 0)
            with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
                conn.execute(
                    "UPDATE users SET marketing_opt_in = false WHERE id = %s",
                    (claimed[0].user_id,),
                )
                conn.execute(
                    "INSERT INTO email_suppressions (email, reason) "
                    "VALUES (lower(btrim(%s)), 'complaint')",
                    (claimed[1].email,),
                )
            entered, skipped = await store.enter_call(cid, claimed)
            return entered, skipped, claimed
        finally:
            await pool.close()

    entered, skipped, claimed = run(scenario())
    assert skipped == 2 and entered == {r.seq for r in claimed[2:]}
    after = rows(settings, cid, seqs)
    assert (after[claimed[0].seq]["status"], after[claimed[0].seq]["reason"]) == (
        "skipped",
        "opted_out",
    )
    assert after[claimed[1].seq]["status"] == "skipped"
    assert after[claimed[1].seq]["reason"] == "suppressed:complaint"
    assert all(after[r.seq]["in_call_at"] is not None for r in claimed[2:])


def test_throttled_rows_leave_their_call_enter_the_next_and_a_release_leaves_it(
    settings: Settings,
) -> None:
    cid = sending_campaign(settings)
    seqs = pending_seqs(settings, cid)[:3]

    async def scenario() -> tuple[set[int], set[int]]:
        pool = await open_pool(settings, size=2)
        try:
            store = RecipientStore(pool, group_id=GROUP, topic=f"t{cid}")
            claimed = await claim(store, cid, seqs, 0)
            first, _ = await store.enter_call(cid, claimed)
            left = await store.leave_call(cid, claimed)  # throttled: none of them was sent
            assert left == len(claimed)
            second, _ = await store.enter_call(cid, claimed)  # the retry
            await store.record_results(
                cid,
                [RowResult(r.seq, "pending", "retry_exhausted:throttled", None) for r in claimed],
                [r.attempt for r in claimed],
            )
            return first, second
        finally:
            await pool.close()

    first, second = run(scenario())
    assert first == second == set(seqs)
    after = rows(settings, cid, seqs)
    assert all(r["status"] == "pending" and r["requeue"] for r in after.values())
    assert all(r["in_call_at"] is None for r in after.values())


def test_rows_out_of_their_call_go_back_to_pending_when_the_lease_runs_out(
    settings: Settings,
) -> None:
    """A worker that dies while throttled rows wait for their retry: the lease returns them
    to pending (SES accepted none of them), while the rows of its call in flight are unknown.
    A claim that is no longer the row's cannot take it out of its call."""
    cid = sending_campaign(settings)
    seqs = pending_seqs(settings, cid)[:6]

    async def scenario() -> tuple[list[ClaimedRecipient], int, int]:
        pool = await open_pool(settings, size=2)
        try:
            store = RecipientStore(pool, group_id=GROUP, topic=f"t{cid}")
            claimed = await claim(store, cid, seqs, 0)
            await store.enter_call(cid, claimed)
            stale = [replace(r, attempt=r.attempt + 1) for r in claimed[4:]]
            refused = await store.leave_call(cid, stale)
            left = await store.leave_call(cid, claimed[:2])
            expire_all_leases(settings, cid)
            return claimed, left, refused
        finally:
            await pool.close()

    claimed, left, refused = run(scenario())
    assert (left, refused) == (2, 0)
    after = rows(settings, cid, seqs)
    for r in claimed[:2]:
        assert (after[r.seq]["status"], after[r.seq]["reason"], after[r.seq]["requeue"]) == (
            "pending",
            "lease_expired_before_call",
            True,
        )
    for r in claimed[2:]:
        assert (after[r.seq]["status"], after[r.seq]["reason"]) == ("unknown", "lease_expired")


def test_entering_a_call_renews_the_lease_so_a_live_call_is_never_declared_unknown(
    settings: Settings,
) -> None:
    """Rows that waited in their lane until their lease had run out (PostgreSQL was down, the
    worker was frozen, or the machine was slow) and that no reconcile has reaped yet still
    enter their call under their claim; the lease then runs from the call's start, so a
    reconcile during the call does not turn the rows of a live worker `unknown` and its
    answer is recorded."""
    cid = sending_campaign(settings)
    seqs = pending_seqs(settings, cid)[:4]
    lease_s = 20.0

    async def scenario() -> tuple[set[int], int]:
        pool = await open_pool(settings, size=2)
        try:
            store = RecipientStore(pool, group_id=GROUP, topic=f"t{cid}")
            claimed = await claim(store, cid, seqs, 0)
            with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
                conn.execute(
                    "UPDATE campaign_recipients SET claimed_at = now() - make_interval(secs => %s)"
                    " WHERE campaign_id = %s AND seq = ANY(%s)",
                    (lease_s + 5, cid, seqs),
                )
            entered, _ = await store.enter_call(cid, claimed)
            with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
                expired = conn.execute(
                    query("expire_leases"), {"campaign_id": cid, "lease_s": lease_s}
                ).rowcount
            await store.record_results(
                cid,
                [RowResult(r.seq, "sent", None, f"m-{r.seq}") for r in claimed],
                [r.attempt for r in claimed],
            )
            return entered, expired
        finally:
            await pool.close()

    entered, expired = run(scenario())
    assert entered == set(seqs)
    assert expired == 0
    after = rows(settings, cid, seqs)
    assert all(r["status"] == "sent" for r in after.values()), after


def test_no_call_enters_once_a_pause_is_committed_whatever_the_worker_has_heard(
    settings: Settings,
) -> None:
    """The worker's view of the campaign lags a pause (NOTIFY, poll): enter_call reads the
    campaign itself, so a call that had not entered when the pause committed never does, and
    its rows stay this claim's, out of any call, for the lane to release."""
    cid = sending_campaign(settings)
    seqs = pending_seqs(settings, cid)[:6]

    def set_status(status: str) -> None:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute("UPDATE campaigns SET status = %s WHERE id = %s", (status, cid))

    async def scenario() -> tuple[list[str], dict[int, dict[str, Any]], set[int]]:
        pool = await open_pool(settings, size=2)
        try:
            store = RecipientStore(pool, group_id=GROUP, topic=f"t{cid}")
            claimed = await claim(store, cid, seqs, 0)
            refused = []
            for status in ("paused", "cancelled"):
                set_status(status)
                try:
                    await store.enter_call(cid, claimed)
                except CampaignNotSending as exc:
                    refused.append(str(exc))
            held = rows(settings, cid, seqs)
            set_status("sending")
            entered, _ = await store.enter_call(cid, claimed)
            return refused, held, entered
        finally:
            await pool.close()

    refused, held, entered = run(scenario())
    assert refused == [f"campaign {cid} is paused", f"campaign {cid} is cancelled"]
    assert all(held[s]["status"] == "sending" and held[s]["in_call_at"] is None for s in seqs)
    assert entered == set(seqs)  # resumed: the same claim enters its call
    after = rows(settings, cid, seqs)
    assert all(after[s]["status"] == "sending" and after[s]["in_call_at"] for s in seqs)
