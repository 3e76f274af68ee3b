"""Seed list first, then the audience, and correction campaigns, on the real stack (Kafka,
PostgreSQL, workers, the SES stand-in over HTTP): the seeds are mailed and nothing else until
the hold ends (by `campaign release` or by running out in a worker's reconcile tick); a cancel
during the hold sends nothing more; a correction reaches exactly the users its source sent
to. What each destination got is read at the SES stand-in."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest

from flashsend.cli.campaign import format_status
from flashsend.cli.control import campaign_report
from flashsend.errors import UsageError
from flashsend.lab.feedback_run import insert_users, wait_for
from flashsend.lab.workers import WorkerPool, wait_joined
from flashsend.settings import Settings
from producers.campaign import snapshot, start_campaign
from producers.campaign_ops import AbTest, control_campaign, create_campaign, promote, release
from producers.reconcile import Reconciler
from sinks.seed_store import SeedPlan, SeedStore
from sinks.variant_store import VariantStore
from streams.rules.ab_test import Variant
from streams.rules.seed_list import RELEASED_BY_EXPIRY
from tests.integration.campaign_helpers import (
    admin,
    new_campaign,
    progress,
    put_template,
    statuses,
    wait_finished,
)

USERS = 1_500


def _audience(settings: Settings) -> tuple[int, str]:
    """A campaign over USERS fresh users u<id>@<domain>; returns (campaign id, domain)."""
    domain = f"seed-{uuid.uuid4().hex[:6]}.flashsend.test"
    insert_users(settings, USERS, domain)
    return new_campaign(settings, rate=0), domain


def _seeds(domain: str) -> list[str]:
    """Two seed inboxes, and one address that is also an audience user's (u7)."""
    return [f"qa1@inbox-{domain}", f"qa2@inbox-{domain}", f"u7@{domain}"]


def _mailed(settings: Settings, cid: int) -> dict[str, float]:
    """Destination -> when the stand-in accepted its mail; each destination once."""
    got: dict[str, float] = {}
    for m in admin(settings).messages(campaign=str(cid), limit=10 * USERS):
        for destination in m["destination"]:
            assert destination not in got, f"{destination} mailed twice"
            got[destination] = float(m["time"])
    return got


def _seeds_sent(settings: Settings, cid: int, n: int) -> dict[str, Any]:
    def settled() -> dict[str, Any] | None:
        p = progress(settings, cid)
        return p.row if p["seed"].get("sent") == n else None

    return wait_for("the seeds sent", settled, 60, 0.2)


def _hold(settings: Settings, cid: int) -> Any:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return SeedStore(conn).state(cid)


def test_seeds_go_first_and_release_sends_the_rest(settings: Settings, tmp_path: Path) -> None:
    s = settings.model_copy(update={"reconcile_interval_s": 1.0})
    cid, domain = _audience(s)
    seeds = _seeds(domain)
    pool = WorkerPool(s, tmp_path)
    pool.start(1)
    try:
        start_campaign(s, cid, seeds=SeedPlan(seeds, 3600))
        row = _seeds_sent(s, cid, len(seeds))
        time.sleep(3)  # reconcile ticks: the hold lasts, nothing else is produced
        assert set(_mailed(s, cid)) == set(seeds), "only the seeds before the release"
        p = progress(s, cid)
        assert p["status"] == "sending" and not p.finished
        assert p["held"] == USERS - 1 and p["sent"] == 0 and p["pending"] == 0, p.row
        assert p["skipped"] == 1  # u7: a seed, mailed once as one
        assert p["recipients"] == USERS and p["seed_recipients"] == len(seeds)
        assert row["hold_released_at"] is None
        assert "seed list 3: sent 3; audience held until" in format_status(p)
        out = release(s, cid, "test operator")
        assert f"{USERS - 1:,} held recipient(s) released" in out, out
        with pytest.raises(UsageError, match="released already"):
            release(s, cid, "second")
        final = wait_finished(s, cid, pool, timeout=90)
    finally:
        pool.stop()
    mailed = _mailed(s, cid)
    assert len(mailed) == USERS + 2  # every user once (u7 as a seed) and the two inboxes
    assert max(mailed[e] for e in seeds) < min(t for e, t in mailed.items() if e not in seeds)
    assert final["sent"] == USERS - 1 and final["seed"] == {"sent": len(seeds)}
    hold = _hold(s, cid)
    assert hold.released_by == "test operator" and not hold.holding
    assert "hold released" in format_status(final) and "by test operator" in format_status(final)
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        report = campaign_report(conn, cid)
    reasons = {(r["status"], r["reason"]): r["count"] for r in report["by_status_reason"]}
    assert reasons == {("sent", None): USERS - 1, ("skipped", "seed_address"): 1}
    assert [r["email"] for r in report["seed_list"]["seeds"]] == seeds
    assert report["seed_list"]["released_by"] == "test operator"


def test_the_hold_runs_out_in_the_workers_reconcile(settings: Settings, tmp_path: Path) -> None:
    s = settings.model_copy(update={"reconcile_interval_s": 1.0})
    cid, domain = _audience(s)
    seeds = _seeds(domain)[:2]
    pool = WorkerPool(s, tmp_path)
    pool.start(1)
    # The hold counts from the seeds' produce: a worker still joining would eat into it.
    wait_joined(s, 1)
    try:
        start_campaign(s, cid, seeds=SeedPlan(seeds, 4.0))
        final = wait_finished(s, cid, pool, timeout=90)
        wait_for("campaign done", lambda: progress(s, cid)["status"] == "done", 30, 0.2)
    finally:
        pool.stop()
    hold = _hold(s, cid)
    assert hold.released_by == RELEASED_BY_EXPIRY
    assert hold.released_at >= hold.hold_until  # the hold counts from the seeds' produce
    assert (hold.hold_until - final["produced_at"]).total_seconds() >= 4.0
    assert final["sent"] == USERS and final["seed"] == {"sent": 2}
    mailed = _mailed(s, cid)
    assert len(mailed) == USERS + 2
    assert max(mailed[e] for e in seeds) < min(t for e, t in mailed.items() if e not in seeds)


def test_cancel_during_the_hold_sends_nothing_more(settings: Settings, tmp_path: Path) -> None:
    s = settings.model_copy(update={"reconcile_interval_s": 1.0})
    cid, domain = _audience(s)
    seeds = _seeds(domain)
    pool = WorkerPool(s, tmp_path)
    pool.start(1)
    # The hold counts from the seeds' produce: a worker still joining would eat into it.
    wait_joined(s, 1)
    try:
        start_campaign(s, cid, seeds=SeedPlan(seeds, 10.0))
        _seeds_sent(s, cid, len(seeds))
        assert _hold(s, cid).holding
        control_campaign(s, cid, "cancel", "wrong code")
        hold = _hold(s, cid)
        assert hold.holding, "the cancel must land inside the hold"
        wait_for("past the hold's end", lambda: time.time() > hold.hold_until.timestamp() + 3, 20)
        with Reconciler(s) as reconciler:
            reconciler.reconcile(cid)
        with pytest.raises(UsageError, match="cancelled"):
            release(s, cid, "too late")
        time.sleep(1)
    finally:
        pool.stop()
    assert set(_mailed(s, cid)) == set(seeds)
    st = statuses(s, cid)
    assert st == {"sent": len(seeds), "cancelled": USERS - 1, "skipped": 1}, st
    assert _hold(s, cid).released_at is None


def test_a_correction_reaches_exactly_the_users_its_source_sent_to(
    settings: Settings, tmp_path: Path
) -> None:
    s = settings.model_copy(update={"reconcile_interval_s": 1.0})
    source, domain = _audience(s)
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        # Skipped at the source's snapshot: an invalid address, a second user of one mailbox.
        conn.execute(
            "INSERT INTO users (id, email, status, marketing_opt_in, first_name) VALUES "
            "(%s, 'broken@@x', 'active', true, 'B'), (%s, %s, 'active', true, 'D')",
            (USERS + 1, USERS + 2, f"U3@{domain}"),
        )
    draft = new_campaign(s, name="draft")
    with pytest.raises(UsageError, match="sent nothing"):
        create_campaign(s, name="early", correction_of=draft)
    pool = WorkerPool(s, tmp_path)
    pool.start(1)
    try:
        start_campaign(s, source, seeds=SeedPlan(_seeds(domain)[:1], 0.0))
        wait_finished(s, source, pool, timeout=90)
        # Done (a worker's reconcile): a sending source refuses the correction's start.
        wait_for("source done", lambda: progress(s, source)["status"] == "done", 30, 0.2)
        with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
            # The source's other outcomes, as its calls would have left them: SES refused
            # some rows, a worker died in the call of others.
            conn.execute(
                "UPDATE campaign_recipients SET status = CASE WHEN user_id %% 10 = 1 "
                "THEN 'failed' ELSE 'unknown' END WHERE campaign_id = %s AND status = 'sent' "
                "AND user_id > 0 AND user_id %% 10 IN (1, 2)",
                (source,),
            )
            sent_users = {
                int(u)
                for (u,) in conn.execute(
                    "SELECT user_id FROM campaign_recipients WHERE campaign_id = %s "
                    "AND status = 'sent' AND user_id > 0",
                    (source,),
                )
            }
            by_status = statuses(s, source)
            assert by_status["failed"] and by_status["unknown"] and by_status["skipped"] >= 2
            # Since the source: one user opted out, one address suppressed.
            conn.execute("UPDATE users SET marketing_opt_in = false WHERE id = 5")
            conn.execute(
                "INSERT INTO email_suppressions (email, reason, source_event) "
                "VALUES (%s, 'complaint', 'test')",
                (f"u6@{domain}",),
            )
        put_template(s)
        fix = create_campaign(s, name="correction", rate=0, correction_of=source)
        fix_row = progress(s, fix)
        assert fix_row["correction_of"] == source
        start_campaign(s, fix)
        final = wait_finished(s, fix, pool, timeout=90)
    finally:
        pool.stop()
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        rows = {
            int(u): (str(st), r)
            for u, st, r in conn.execute(
                "SELECT user_id, status, reason FROM campaign_recipients WHERE campaign_id = %s",
                (fix,),
            )
        }
    # Exactly the sent users, minus the opt-out and the suppressed address.
    assert set(rows) == sent_users - {5, 6}
    assert {st for st, _ in rows.values()} == {"sent"}
    assert final["sent"] == len(sent_users) - 2
    mailed = set(_mailed(s, fix))
    assert mailed == {f"u{u}@{domain}" for u in sent_users - {5, 6}}


def test_a_correction_waits_until_its_source_stops_sending(settings: Settings) -> None:
    source, _ = _audience(settings)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        snapshot(conn, source, settings.audience_condition)  # now sending, nothing sent yet
    fix = create_campaign(settings, name="correction", correction_of=source)
    with pytest.raises(UsageError, match="still sending"):
        start_campaign(settings, fix, skip_preflight=True)
    assert progress(settings, fix)["status"] == "draft"
    control_campaign(settings, source, "pause", "found a wrong code")
    start_campaign(settings, fix, skip_preflight=True)
    assert progress(settings, fix)["recipients"] == 0  # nothing had been sent


def test_an_ab_test_waits_for_the_hold_then_its_holdout_for_the_winner(
    settings: Settings,
) -> None:
    """No workers: what the hold and the release leave in the rows. The test share is held
    with the holdout; the release frees only the test share; no winner while the hold lasts,
    and the holdout wait counts from the release."""
    put_template(settings)
    domain = f"seedab-{uuid.uuid4().hex[:6]}.flashsend.test"
    insert_users(settings, USERS, domain)
    ab = AbTest([Variant("A", "flash_sale", 10), Variant("B", "flash_sale", 20)], 3600, "manual")
    cid = create_campaign(settings, name="ab", rate=0, ab=ab)
    start_campaign(settings, cid, seeds=SeedPlan([f"qa@inbox-{domain}"], 3600))
    assert statuses(settings, cid) == {"pending": 1, "held": USERS}
    with pytest.raises(UsageError, match="holds for its seed list"):
        promote(settings, cid, "B")
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        state = VariantStore(conn).state(cid)
        assert state is not None and state.snapshot_done_at is None  # no winner due
        test_share = conn.execute(
            "SELECT count(*) FROM campaign_recipients WHERE campaign_id = %s "
            "AND user_id > 0 AND variant IS NOT NULL",
            (cid,),
        ).fetchone()
    assert test_share is not None
    release(settings, cid, "t")
    assert statuses(settings, cid) == {"pending": 1 + test_share[0], "held": USERS - test_share[0]}
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        state = VariantStore(conn).state(cid)
    assert state is not None and state.snapshot_done_at == _hold(settings, cid).released_at
    assert "B (flash_sale) wins" in promote(settings, cid, "B")
    assert statuses(settings, cid) == {"pending": USERS + 1}


def test_pause_during_the_hold_releases_on_resume(settings: Settings) -> None:
    """No workers: a paused campaign's hold is not released by running out; the resume's
    reconcile releases and produces it. A release while paused is produced on resume."""
    cid, domain = _audience(settings)
    start_campaign(settings, cid, seeds=SeedPlan([f"qa@inbox-{domain}"], 1.0))
    control_campaign(settings, cid, "pause", "look at the seed mail")
    time.sleep(1.5)  # the hold runs out while paused
    with Reconciler(settings) as reconciler:
        assert not reconciler.reconcile(cid).hold_released
    assert _hold(settings, cid).holding and statuses(settings, cid)["held"] == USERS
    out = control_campaign(settings, cid, "resume", None)
    assert f"{USERS:,} pending recipient(s) queued again" in out, out
    assert _hold(settings, cid).released_by == RELEASED_BY_EXPIRY
    assert statuses(settings, cid) == {"pending": USERS + 1}

    other = new_campaign(settings, rate=0)  # the same users
    start_campaign(settings, other, seeds=SeedPlan([f"qa@inbox-{domain}"], 3600))
    control_campaign(settings, other, "pause", "look at the seed mail")
    assert "produced on resume" in release(settings, other, "t")
    out = control_campaign(settings, other, "resume", None)
    assert f"{USERS:,} pending recipient(s) queued again" in out, out
