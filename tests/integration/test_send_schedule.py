"""Scheduled sending on the real stack, with an injected clock: a local-time window over
several zones (only the due zone's rows are produced and sent; advancing the clock releases
the next slot; pause stops the scheduler; resume releases what came due, two zones at once
within the campaign's rate; cancel during a wait sends nothing more) and engagement waves.

The injected clock runs in 2030, so the workers' own reconcile ticks (real clock) never find
a slot due: every release in these tests is the one the test's clock makes."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from flashsend.lab.demo import DemoOptions, run_demo
from flashsend.lab.feedback_run import wait_for
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from producers.campaign import start_campaign
from producers.campaign_ops import create_campaign
from producers.reconcile import requeue_after_resume
from sinks.campaign_store import CampaignStore
from sinks.schedule_store import ScheduleStore, schedule_summary
from streams.rules.send_plan import Schedule, parse_waves, parse_window, plan_waves, wave_send_after
from tests.integration.campaign_helpers import (
    admin,
    put_template,
    reconcile_at,
    settled,
    statuses,
    wait_finished,
)

T0 = datetime(2030, 6, 3, 7, 30, tzinfo=UTC)
# (zone, users): at T0 UTC is inside 07:00-09:00 (due now), as are the unknown zone and users
# without a zone (the default, UTC); UTC-1, -2, -3 open at 08:00, 09:00 and 10:00 UTC; Tokyo's
# window of that date has ended (skipped, window_passed).
ZONES: list[tuple[str | None, int]] = [
    ("UTC", 100),
    ("Mars/Olympus_Mons", 20),
    (None, 30),
    ("Etc/GMT+1", 150),
    ("Etc/GMT+2", 150),
    ("Etc/GMT+3", 150),
    ("Asia/Tokyo", 50),
]
DUE_AT_START = {"UTC", "Mars/Olympus_Mons", None}
RATE = 60.0


def _users(settings: Settings) -> dict[int, str | None]:
    """Users 1..N in ZONES' order; returns user id → zone."""
    zone_of: dict[int, str | None] = {}
    uid = 0
    for zone, n in ZONES:
        for _ in range(n):
            uid += 1
            zone_of[uid] = zone
    ids = list(zone_of)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO users (id, email, status, marketing_opt_in, first_name, timezone) "
            "SELECT i, 'u' || i || '@zones.flashsend.test', 'active', true, 'Lan', z "
            "FROM unnest(%s::bigint[], %s::text[]) AS t(i, z)",
            (ids, [zone_of[i] for i in ids]),
        )
        conn.execute("ANALYZE users")
    return zone_of


def _window_campaign(settings: Settings) -> tuple[int, dict[int, str | None]]:
    zone_of = _users(settings)
    put_template(settings)
    cid = create_campaign(
        settings,
        name="local window",
        rate=RATE,
        schedule=Schedule(window=parse_window("07:00-09:00", "2030-06-03")),
    )
    return cid, zone_of


def _rows(settings: Settings, cid: int) -> dict[int, tuple[str, str | None]]:
    with psycopg.connect(settings.pg_dsn) as conn:
        return {
            int(u): (str(s), r)
            for u, s, r in conn.execute(
                "SELECT user_id, status, reason FROM campaign_recipients WHERE campaign_id = %s",
                (cid,),
            )
        }


def _mailed(settings: Settings, cid: int) -> set[int]:
    """User ids SES was asked to mail (each once)."""
    got: list[int] = []
    for m in admin(settings).messages(campaign=str(cid), limit=10_000):
        got += [int(d.split("@")[0][1:]) for d in m["destination"]]
    assert len(got) == len(set(got)), "a recipient was mailed twice"
    return set(got)


def _users_in(zone_of: dict[int, str | None], zones: set[str | None]) -> set[int]:
    return {u for u, z in zone_of.items() if z in zones}


def test_local_window_releases_each_zone_when_due_and_pause_stops_the_scheduler(
    settings: Settings, tmp_path: Path
) -> None:
    s = settings.model_copy(update={"reconcile_interval_s": 1.0})
    cid, zone_of = _window_campaign(s)
    pool = WorkerPool(s, tmp_path)
    pool.start(1)
    try:
        started = start_campaign(s, cid, now=T0)
        due_now = _users_in(zone_of, DUE_AT_START)
        assert started.produced == len(due_now)  # no doorbell for a row not yet due
        with psycopg.connect(s.pg_dsn) as conn:
            weights = conn.execute(
                "SELECT partition_weights FROM campaigns WHERE id = %s", (cid,)
            ).fetchone()
        assert weights == (None,)  # the start's rows are not the campaign's spread: even split
        settled(s, cid)
        time.sleep(3)  # the workers' reconcile ticks (real clock) release nothing
        rows = _rows(s, cid)
        assert _mailed(s, cid) == due_now
        assert {u for u, (st, _) in rows.items() if st == "held"} == _users_in(
            zone_of, {"Etc/GMT+1", "Etc/GMT+2", "Etc/GMT+3"}
        )
        assert {u for u, sr in rows.items() if sr == ("skipped", "window_passed")} == (
            _users_in(zone_of, {"Asia/Tokyo"})
        )
        with psycopg.connect(s.pg_dsn) as conn:
            summary = schedule_summary(ScheduleStore(conn), cid)
        assert summary is not None
        assert summary["unknown_timezones"] == {"Mars/Olympus_Mons": 20}
        assert [(x["slot_at"], x["recipients"], x["waiting"]) for x in summary["slots"]] == [
            (T0.isoformat(), 150, 0),
            (datetime(2030, 6, 3, 8, tzinfo=UTC).isoformat(), 150, 150),
            (datetime(2030, 6, 3, 9, tzinfo=UTC).isoformat(), 150, 150),
            (datetime(2030, 6, 3, 10, tzinfo=UTC).isoformat(), 150, 150),
        ]

        reconcile_at(s, cid, T0 + timedelta(minutes=29))  # 07:59: nothing due yet
        assert statuses(s, cid)["held"] == 450
        reconcile_at(s, cid, T0 + timedelta(minutes=31))  # 08:01: UTC-1's slot
        settled(s, cid)
        assert _mailed(s, cid) == due_now | _users_in(zone_of, {"Etc/GMT+1"})
        assert statuses(s, cid)["held"] == 300

        with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
            CampaignStore(conn).transition(cid, "paused", "test pause")
            assert ScheduleStore(conn).release_due(cid, T0 + timedelta(hours=5)).rows == 0
        reconcile_at(s, cid, T0 + timedelta(hours=3))  # 10:30, paused: nothing released
        time.sleep(2)
        assert statuses(s, cid)["held"] == 300
        assert _mailed(s, cid) == due_now | _users_in(zone_of, {"Etc/GMT+1"})

        with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
            CampaignStore(conn).transition(cid, "sending", None)
        # Resume at 10:30: UTC-2's and UTC-3's slots are both due, released together.
        assert requeue_after_resume(s, cid, clock=lambda: T0 + timedelta(hours=3)) == 300
        final = wait_finished(s, cid, pool, timeout=90)
        wait_for("campaign done", lambda: _status(s, cid) == "done", 30, 0.2)
    finally:
        pool.stop()
    expected = set(zone_of) - _users_in(zone_of, {"Asia/Tokyo"})
    assert _mailed(s, cid) == expected
    assert final["sent"] == len(expected) and final["skipped"] == 50
    stats = admin(s).stats(campaign=str(cid))
    assert stats["duplicates"] == 0
    assert stats["max_1s_window"] <= RATE * 1.02, stats  # one limit across the zones


def _status(settings: Settings, cid: int) -> str:
    with psycopg.connect(settings.pg_dsn) as conn:
        return CampaignStore(conn).status(cid)


def test_cancel_during_the_wait_sends_nothing_more(settings: Settings, tmp_path: Path) -> None:
    s = settings.model_copy(update={"reconcile_interval_s": 1.0})
    cid, zone_of = _window_campaign(s)
    pool = WorkerPool(s, tmp_path)
    pool.start(1)
    try:
        start_campaign(s, cid, now=T0)
        settled(s, cid)
        with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
            CampaignStore(conn).transition(cid, "cancelled", "test cancel")
        reconcile_at(s, cid, T0 + timedelta(hours=5))  # every slot due by now
        time.sleep(2)
    finally:
        pool.stop()
    counts = statuses(s, cid)
    assert "held" not in counts and "pending" not in counts
    assert counts["cancelled"] == 450
    assert _mailed(s, cid) == _users_in(zone_of, DUE_AT_START)


def test_waves_send_the_recently_engaged_first_then_the_rest_slot_by_slot(
    settings: Settings, tmp_path: Path
) -> None:
    s = settings.model_copy(update={"reconcile_interval_s": 1.0})
    users = 240
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        # Users 1..80 opened 3 days ago, 81..120 clicked 40 days ago (not recent), the rest never.
        conn.execute(
            "INSERT INTO users (id, email, status, marketing_opt_in, first_name, last_open_at, "
            "last_click_at) SELECT g, 'w' || g || '@waves.flashsend.test', 'active', true, "
            "'An', CASE WHEN g <= 80 THEN %(t)s::timestamptz - interval '3 days' END, "
            "CASE WHEN g BETWEEN 81 AND 120 THEN %(t)s::timestamptz - interval '40 days' END "
            "FROM generate_series(1, %(n)s) g",
            {"t": T0, "n": users},
        )
    put_template(s)
    waves = parse_waves("recent:2m,rest:1h")
    cid = create_campaign(s, name="waves", rate=0, schedule=Schedule(waves=waves))
    plan = plan_waves(waves, T0, s.recent_engagement_days)
    due = {
        u: wave_send_after(plan, cid, u, recent=u <= 80) for u in range(1, users + 1)
    }  # the pure twin
    pool = WorkerPool(s, tmp_path)
    pool.start(1)
    try:
        start_campaign(s, cid, now=T0)
        settled(s, cid)
        with psycopg.connect(s.pg_dsn) as conn:
            stored = dict(
                conn.execute(
                    "SELECT user_id, send_after FROM campaign_recipients WHERE campaign_id = %s",
                    (cid,),
                ).fetchall()
            )
        assert stored == due
        assert _mailed(s, cid) == {u for u, at in due.items() if at <= T0}
        for minutes in (1, 2, 3):
            now = T0 + timedelta(minutes=minutes)
            reconcile_at(s, cid, now)
            settled(s, cid)
            assert _mailed(s, cid) == {u for u, at in due.items() if at <= now}, minutes
        # Wave 1 (the 80 recent users) is complete two minutes in; the rest wait for theirs.
        assert {u for u in range(1, 81)} <= _mailed(s, cid)
        assert statuses(s, cid)["held"] == sum(
            1 for at in due.values() if at > T0 + timedelta(minutes=3)
        )
    finally:
        pool.stop()


def test_demo_local_window_reports_its_slots(settings: Settings) -> None:
    """`flashsend demo --local-window` end to end (its compressed clock releases each slot)."""
    summary = run_demo(
        settings,
        DemoOptions(
            users=2_000, rate=0, workers=1, show_progress=False, local_window="09:00-11:00"
        ),
        log=lambda *_: None,
    )
    assert "error" not in summary, summary
    slots = summary["slots"]
    assert len(slots) >= 6  # the demo's zones open at six or more distinct UTC times
    assert sum(x["recipients"] for x in slots) == summary["recipients"]
    assert sum(x["sent"] for x in slots) == summary["sent"] == summary["accepted_by_ses"] > 0
    assert all(x["waiting"] == 0 for x in slots)
    unknown = summary["schedule"]["unknown_timezones"]
    assert list(unknown) == ["Mars/Olympus_Mons"] and 0 < unknown["Mars/Olympus_Mons"] <= 250
    assert summary["clock_jumps"] >= len(slots) - 1
    assert summary["duplicates"] == 0 and summary["status"] == "done"
