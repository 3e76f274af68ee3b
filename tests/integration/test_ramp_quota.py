"""The rate ramp measured at the SES stand-in, the ramp's clock in PostgreSQL (pause time
does not count), and the 24-hour quota refusal at start, on the real stack."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from flashsend.lab.demo import DemoOptions, run_demo
from flashsend.lab.ramp_figures import step_windows
from flashsend.lab.workers import WorkerPool, wait_joined
from flashsend.settings import Settings
from producers.campaign import start_campaign
from producers.campaign_ops import control_campaign, create_campaign
from producers.send_quota import QuotaExceeded
from sinks.ramp_store import ramp_status
from sinks.ses import SesSender, make_client
from sinks.users import seed_users
from streams.rules.ramp import parse_ramp
from tests.integration.campaign_helpers import (
    admin,
    put_template,
    stats,
    statuses,
    wait_finished,
)


def _sending_clock(settings: Settings, cid: int) -> tuple[float, float | None]:
    with psycopg.connect(settings.pg_dsn) as conn:
        row = conn.execute(
            "SELECT sending_s, extract(epoch FROM sending_since)::float8 FROM campaigns "
            "WHERE id = %s",
            (cid,),
        ).fetchone()
    assert row is not None
    return float(row[0]), row[1]


def test_the_ramp_clock_counts_sending_time_only(settings: Settings) -> None:
    seed_users(settings.pg_dsn, 50)
    put_template(settings)
    cid = create_campaign(settings, name="clock", ramp=parse_ramp("0:100,30s:300"))
    began = time.monotonic()
    start_campaign(settings, cid)  # no workers: the campaign stays sending
    time.sleep(0.3)
    control_campaign(settings, cid, "pause", None)
    paused_at_s, since = _sending_clock(settings, cid)
    assert since is None
    assert 0.3 <= paused_at_s <= time.monotonic() - began
    time.sleep(1.5)
    with psycopg.connect(settings.pg_dsn) as conn:
        paused = ramp_status(conn, cid)
    assert paused is not None
    assert paused["sending_s"] == pytest.approx(paused_at_s, abs=0.05)  # the pause stops it
    assert (paused["step"], paused["rate"], paused["next_rate"]) == (1, 100, 300)
    assert paused["next_in_s"] == pytest.approx(30 - paused_at_s, abs=0.1)
    resuming = time.monotonic()
    control_campaign(settings, cid, "resume", None)  # also queues the pending rows again
    time.sleep(0.6)
    with psycopg.connect(settings.pg_dsn) as conn:
        resumed = ramp_status(conn, cid)
    assert resumed is not None
    # The clock goes on from where the pause left it (ramp_status rounds to 0.1 s).
    assert paused_at_s + 0.6 - 0.05 <= resumed["sending_s"]
    assert resumed["sending_s"] <= paused_at_s + time.monotonic() - resuming + 0.1
    assert resumed["effective_rate"] == 100
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        # Past the last offset the last step holds, at the rate limit (the highest step).
        conn.execute("UPDATE campaigns SET sending_s = sending_s + 60 WHERE id = %s", (cid,))
        held = ramp_status(conn, cid)
    assert held is not None
    assert (held["step"], held["rate"], held["next_rate"], held["effective_rate"]) == (
        2,
        300,
        None,
        300,
    )


@pytest.mark.parametrize(
    ("ramp", "users"),
    [("0:100,5s:300", 2_200), ("0:300,5s:100", 2_000)],
    ids=["step-up", "step-down"],
)
def test_the_ramp_holds_in_every_second_of_each_step(
    settings: Settings, ramp: str, users: int
) -> None:
    """At the stand-in, every sliding second that lies within one step stays within that
    step's rate (x 1.02); one that straddles a step up stays within the higher rate (no
    burst); a step down applies within a second. The higher step sends past the lower
    step's limit, so the campaign really followed the ramp."""
    first, second = parse_ramp(ramp)
    seed_users(settings.pg_dsn, users)
    put_template(settings)
    cid = create_campaign(settings, name="ramp", ramp=(first, second))
    pool = WorkerPool(settings, settings.state_dir / f"logs-{cid}")
    try:
        pool.start(2)
        wait_joined(settings, 2)  # the ramp's clock starts at the snapshot
        start_campaign(settings, cid)
        _, since = _sending_clock(settings, cid)
        wait_finished(settings, cid, pool, timeout=120)
    finally:
        pool.stop()
    assert since is not None
    s = stats(settings, cid)
    assert s["duplicates"] == 0
    assert statuses(settings, cid).get("pending", 0) == 0
    points = admin(settings).rate(str(cid), bucket_ms=1)  # exact to the millisecond
    first_step, second_step = step_windows(points, since, (first, second))
    in_first, in_second = first_step["max_1s_window"], second_step["max_1s_window"]
    assert in_first is not None and in_second is not None, (since, points[:3], points[-3:])
    assert in_first <= first.rate * 1.02, (in_first, first)
    assert in_second <= second.rate * 1.02, (in_second, second)
    # Across the change: a step up adds no burst above the new rate, and a step down settles
    # within a second (its step's figure above starts a second after it).
    assert s["max_1s_window"] <= max(first.rate, second.rate) * 1.02, s
    # The ramp was followed, not merely the lower rate throughout: the step with the higher
    # limit sent past the lower one's.
    higher, lower = (in_first, second) if first.rate > second.rate else (in_second, first)
    assert higher > lower.rate * 1.02, (in_first, in_second, first, second)


def _sent_last_24h(settings: Settings) -> float:
    return SesSender(make_client(settings, timeout=10)).get_send_quota()["SentLast24Hours"]


def test_start_is_refused_when_the_24_hour_quota_is_short(settings: Settings) -> None:
    seed_users(settings.pg_dsn, 300)
    put_template(settings)
    ses = admin(settings)
    before = ses.faults()
    # Something was sent in the last 24 hours: a few mails straight to SES.
    client = make_client(settings, timeout=10)
    for i in range(5):
        client.send_email(
            FromEmailAddress=settings.from_address,
            Destination={"ToAddresses": [f"quota-{i}@example.com"]},
            Content={"Simple": {"Subject": {"Data": "q"}, "Body": {"Text": {"Data": "q"}}}},
        )
    # Another live campaign still holds its rows (no workers: they stay pending).
    other = create_campaign(settings, name="other", rate=0)
    start_campaign(settings, other)
    held = statuses(settings, other)["pending"]
    needed = held  # the same audience
    sent = _sent_last_24h(settings)
    assert sent >= 5 and held > 100
    try:
        ses.set_faults(max_24h_send=sent + held + needed - 1)
        cid = create_campaign(settings, name="short", rate=0)
        with pytest.raises(QuotaExceeded) as refused:
            start_campaign(settings, cid)
        line = str(refused.value)
        assert "\n" not in line
        for figure in (
            f"needs {needed:,}",
            f"remaining {needed - 1:,}",
            f"Max24HourSend {sent + held + needed - 1:,.0f}",
            f"SentLast24Hours {sent:,.0f}",
            f"{held:,} still to send by other live campaigns",
            "--ignore-quota",
        ):
            assert figure in line, (figure, line)
        assert statuses(settings, cid) == {}  # the snapshot rolled back: still a draft
        with psycopg.connect(settings.pg_dsn) as conn:
            assert conn.execute(
                "SELECT status FROM campaigns WHERE id = %s", (cid,)
            ).fetchone() == ("draft",)
        # Exactly enough: it starts.
        ses.set_faults(max_24h_send=sent + held + needed)
        assert start_campaign(settings, cid).pending == needed
        # Now both hold the quota: a third start is refused, unless told to go anyway.
        third = create_campaign(settings, name="third", rate=0)
        with pytest.raises(QuotaExceeded, match="remaining 0 "):
            start_campaign(settings, third)
        assert start_campaign(settings, third, ignore_quota=True).pending == needed
    finally:
        ses.set_faults(max_24h_send=before["max_24h_send"])


def test_demo_reports_the_ramp(settings: Settings) -> None:
    summary = run_demo(
        settings,
        DemoOptions(
            # 5 s: on a loaded machine the first sends may come 2 s after the start
            users=1_500,
            workers=1,
            timeout_s=120,
            show_progress=False,
            ramp="0:100,5s:300",
        ),
        log=lambda _: None,
    )
    assert summary["status"] == "done" and summary["duplicates"] == 0, summary
    ramp = summary["ramp"]
    assert ramp["ramp"] == "0s:100,5s:300"
    first, second = ramp["steps"]
    assert (first["rate"], second["rate"]) == (100, 300)
    assert first["max_1s_window"] is not None and first["max_1s_window"] <= 102, ramp
    assert second["max_1s_window"] is not None and second["max_1s_window"] <= 306, ramp
    assert summary["max_1s_window"] <= 306


def test_two_starts_at_once_do_not_both_take_the_last_of_the_quota(settings: Settings) -> None:
    """Each of two campaigns fits the quota alone, not both: started at the same instant,
    exactly one is refused (the second to check sees the first's committed rows)."""
    seed_users(settings.pg_dsn, 5_000)
    put_template(settings)
    ses = admin(settings)
    before = ses.faults()
    cids = [create_campaign(settings, name=f"race-{i}", rate=0) for i in range(2)]
    with psycopg.connect(settings.pg_dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM users u WHERE " + settings.audience_condition
        ).fetchone()
    assert row is not None
    audience = int(row[0])  # an upper bound of each campaign's pending rows
    sent = _sent_last_24h(settings)
    barrier = threading.Barrier(2)
    outcomes: dict[int, str] = {}

    def start(cid: int) -> None:
        barrier.wait()
        try:
            start_campaign(settings, cid)
            outcomes[cid] = "started"
        except QuotaExceeded:
            outcomes[cid] = "refused"

    try:
        ses.set_faults(max_24h_send=sent + audience * 1.5)
        threads = [threading.Thread(target=start, args=(cid,)) for cid in cids]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        ses.set_faults(max_24h_send=before["max_24h_send"])
    assert sorted(outcomes.values()) == ["refused", "started"], outcomes
