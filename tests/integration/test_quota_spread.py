"""`campaign start --spread-over-quota` on the real stack, with an injected clock: a campaign
larger than what the 24-hour quota has left sends that much at once and holds the rest in one
slot a day, each released only when its day comes (the clock runs in 2030, so the workers'
own reconcile ticks never find a day due)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from flashsend.errors import UsageError
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from producers.campaign import start_campaign
from producers.campaign_ops import create_campaign
from producers.send_quota import DAY_S, SPREAD_MARGIN_S
from sinks.schedule_store import ScheduleStore, schedule_summary
from sinks.ses import SesSender, make_client
from sinks.users import seed_users
from streams.rules.send_plan import Schedule, parse_window
from tests.integration.campaign_helpers import (
    admin,
    put_template,
    reconcile_at,
    settled,
    stats,
    statuses,
)

T0 = datetime(2030, 6, 3, 7, 30, tzinfo=UTC)
PER_DAY = 100
RATE = 50.0


def _mailed(settings: Settings, cid: int) -> int:
    got = [
        d
        for m in admin(settings).messages(campaign=str(cid), limit=10_000)
        for d in m["destination"]
    ]
    assert len(got) == len(set(got)), "a recipient was mailed twice"
    return len(got)


def _skipped(settings: Settings, cid: int) -> int:
    return statuses(settings, cid).get("skipped", 0)


def test_a_campaign_over_the_quota_is_spread_over_days(settings: Settings, tmp_path: Path) -> None:
    seed_users(settings.pg_dsn, 300)
    put_template(settings)
    ses = admin(settings)
    before = ses.faults()
    sent_24h = SesSender(make_client(settings, timeout=10)).get_send_quota()["SentLast24Hours"]
    s = settings.model_copy(update={"reconcile_interval_s": 1.0})
    pool = WorkerPool(s, tmp_path)
    try:
        ses.set_faults(max_24h_send=sent_24h + PER_DAY)
        cid = create_campaign(s, name="over the quota", rate=RATE)
        pool.start(1)
        started = start_campaign(s, cid, now=T0, spread_over_quota=True)
        needed = started.recipients - _skipped(s, cid)
        assert needed > 2 * PER_DAY, needed  # three days: 100, 100, the rest
        assert started.produced == PER_DAY  # only today's share has doorbells
        counts = settled(s, cid)
        time.sleep(3)  # the workers' reconcile ticks (real clock) release nothing
        assert counts.get("sent") == PER_DAY and _mailed(s, cid) == PER_DAY, counts
        assert statuses(s, cid)["held"] == needed - PER_DAY

        period = timedelta(seconds=DAY_S + PER_DAY / RATE + SPREAD_MARGIN_S)
        with psycopg.connect(s.pg_dsn) as conn:
            summary = schedule_summary(ScheduleStore(conn), cid)
        assert summary is not None
        assert summary["quota_plan"] == {
            "needed": needed,
            "per_day": PER_DAY,
            "days": 3,
            "period_s": period.total_seconds(),
        }
        assert [(x["slot_at"], x["recipients"]) for x in summary["slots"]] == [
            ((T0 + period).isoformat(), PER_DAY),
            ((T0 + 2 * period).isoformat(), needed - 2 * PER_DAY),
        ]

        # The stand-in's own clock cannot jump a day: its quota is lifted instead, as SES's
        # rolling window would have emptied by then.
        ses.set_faults(max_24h_send=before["max_24h_send"])
        reconcile_at(s, cid, T0 + period - timedelta(seconds=1))  # not yet out of the window
        assert statuses(s, cid)["held"] == needed - PER_DAY
        reconcile_at(s, cid, T0 + period)
        settled(s, cid)
        assert _mailed(s, cid) == 2 * PER_DAY
        reconcile_at(s, cid, T0 + 2 * period)
        counts = settled(s, cid)
        assert _mailed(s, cid) == needed and counts.get("held", 0) == 0, counts
        assert stats(s, cid)["duplicates"] == 0
    finally:
        pool.stop()
        ses.set_faults(max_24h_send=before["max_24h_send"])


def test_only_a_plain_campaign_is_spread(settings: Settings) -> None:
    seed_users(settings.pg_dsn, 50)
    put_template(settings)
    scheduled = create_campaign(
        settings,
        name="scheduled",
        schedule=Schedule(window=parse_window("07:00-09:00", "2030-06-03")),
    )
    with pytest.raises(UsageError, match="plain campaign"):
        start_campaign(settings, scheduled, now=T0, spread_over_quota=True)
    plain = create_campaign(settings, name="plain")
    with pytest.raises(UsageError, match="--ignore-quota"):
        start_campaign(settings, plain, spread_over_quota=True, ignore_quota=True)
    assert statuses(settings, scheduled) == {} and statuses(settings, plain) == {}
