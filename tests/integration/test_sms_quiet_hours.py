"""Quiet hours for SMS on the real stack: a campaign texts each zone only within the send
hours of its local day (FLASHSEND_SMS_SEND_HOURS), holds the zones that are asleep until
their morning, and never texts a row after its window has ended.

The planning test runs on an injected clock in 2030, so the workers' own reconcile ticks (real
clock) never release a slot and every deadline is in the workers' future. The deadline test
plans two days in the past: its rows are due at once, and their window ended long before the
workers (real clock) reach them."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from flashsend.errors import UsageError
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from producers.campaign import start_campaign
from producers.campaign_ops import create_campaign
from sinks.recipient_store import ClaimedRecipient, LiveCampaign
from sinks.sms import SmsSender, make_sms_client
from streams.rules.send_plan import Schedule, parse_window
from streams.sms_channel import SmsChannel
from tests.integration.campaign_helpers import admin, reconcile_at, settled

HOURS = "08:00-21:00"
T0 = datetime(2030, 6, 3, 7, 30, tzinfo=UTC)
# (zone, users) at T0: 07:30 in UTC (asleep until 08:00 UTC), 09:30 in UTC+2 (until 19:00
# UTC), 16:30 in Tokyo (until 12:00 UTC), 00:30 in Los Angeles (PDT: 08:00 there is 15:00 UTC).
ZONES: list[tuple[str, int]] = [
    ("UTC", 20),
    ("Etc/GMT-2", 30),
    ("Asia/Tokyo", 25),
    ("America/Los_Angeles", 15),
]
AT = {  # zone -> (send_after, send_before)
    "UTC": (datetime(2030, 6, 3, 8, tzinfo=UTC), datetime(2030, 6, 3, 21, tzinfo=UTC)),
    "Etc/GMT-2": (T0, datetime(2030, 6, 3, 19, tzinfo=UTC)),
    "Asia/Tokyo": (T0, datetime(2030, 6, 3, 12, tzinfo=UTC)),
    "America/Los_Angeles": (
        datetime(2030, 6, 3, 15, tzinfo=UTC),
        datetime(2030, 6, 4, 4, tzinfo=UTC),
    ),
}


def _users(settings: Settings, zones: list[tuple[str, int]]) -> dict[int, str]:
    """Users 1..N with a phone each, in `zones`' order; returns user id -> zone."""
    zone_of: dict[int, str] = {}
    for zone, n in zones:
        for _ in range(n):
            zone_of[len(zone_of) + 1] = zone
    base = uuid.uuid4().int % 10**5 * 1000  # 8 digits after +4479
    ids = list(zone_of)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO users (id, email, status, marketing_opt_in, first_name, timezone, phone) "
            "SELECT i, 'u' || i || '@quiet.flashsend.test', 'active', true, 'Lan', z, "
            "'+4479' || lpad((%s + i)::text, 8, '0') "
            "FROM unnest(%s::bigint[], %s::text[]) AS t(i, z)",
            (base, ids, [zone_of[i] for i in ids]),
        )
        conn.execute("ANALYZE users")
    return zone_of


def _rows(settings: Settings, cid: int) -> dict[int, tuple[str, str | None, object, object]]:
    with psycopg.connect(settings.pg_dsn) as conn:
        return {
            int(r[0]): (str(r[1]), r[2], r[3], r[4])
            for r in conn.execute(
                "SELECT user_id, status, reason, send_after, send_before "
                "FROM campaign_recipients WHERE campaign_id = %s",
                (cid,),
            )
        }


def _texted(settings: Settings, cid: int) -> list[str]:
    return [m["destination"] for m in admin(settings).sms_messages(campaign=str(cid))]


def test_sms_campaign_texts_each_zone_within_its_send_hours(
    settings: Settings, tmp_path: Path
) -> None:
    s = settings.model_copy(update={"reconcile_interval_s": 1.0, "sms_send_hours": HOURS})
    zone_of = _users(s, ZONES)
    cid = create_campaign(s, name="quiet", template="Hi {{first_name}}", channel="sms")
    pool = WorkerPool(s, tmp_path)
    pool.start(1)
    try:
        started = start_campaign(s, cid, now=T0)
        awake = [u for u, z in zone_of.items() if AT[z][0] == T0]
        assert started.produced == len(awake)
        settled(s, cid)
        rows = _rows(s, cid)
        for user, zone in zone_of.items():
            after, before = AT[zone]
            assert rows[user][2:] == (after, before), (zone, rows[user])
            assert rows[user][0] == ("sent" if after == T0 else "held"), (zone, rows[user])
        assert len(_texted(s, cid)) == len(awake)

        reconcile_at(s, cid, T0 + timedelta(minutes=31))  # 08:01 UTC: the UTC zone wakes
        counts = settled(s, cid)
        assert counts == {"sent": len(awake) + 20, "held": 15}
        reconcile_at(s, cid, datetime(2030, 6, 3, 15, 1, tzinfo=UTC))  # 08:01 in LA
        counts = settled(s, cid)
    finally:
        pool.stop()
    assert counts == {"sent": len(zone_of)}
    texted = _texted(s, cid)
    assert len(texted) == len(set(texted)) == len(zone_of)


def test_a_row_past_its_window_is_never_texted(settings: Settings, tmp_path: Path) -> None:
    """Planned two days ago in a zone where it was 12:xx then: every row was due at once with
    a deadline (21:00 local that day) long gone by the time the worker reaches it. Each is
    skipped `quiet_hours` and the provider gets no request."""
    s = settings.model_copy(update={"sms_send_hours": HOURS})
    then = datetime.now(UTC) - timedelta(days=2)
    offset = 12 - then.hour  # hours east of UTC where `then` reads 12:xx
    zone = "UTC" if offset == 0 else f"Etc/GMT{-offset:+d}"
    zone_of = _users(s, [(zone, 40)])
    cid = create_campaign(s, name="too late", template="Hi {{first_name}}", channel="sms")
    pool = WorkerPool(s, tmp_path)
    pool.start(1)
    try:
        started = start_campaign(s, cid, now=then)
        assert started.produced == len(zone_of)
        counts = settled(s, cid)
    finally:
        pool.stop()
    rows = _rows(s, cid)
    assert counts == {"skipped": 40}
    assert {r[1] for r in rows.values()} == {"quiet_hours"}
    assert all(isinstance(r[3], datetime) and r[3] < datetime.now(UTC) for r in rows.values())
    assert _texted(s, cid) == []


def test_a_local_window_outside_the_send_hours_is_refused(settings: Settings) -> None:
    s = settings.model_copy(update={"sms_send_hours": HOURS})
    late = Schedule(window=parse_window("20:00-22:00"))
    with pytest.raises(UsageError, match="quiet hours"):
        create_campaign(s, name="night", template="x", channel="sms", schedule=late)
    with psycopg.connect(s.pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM campaigns").fetchone() == (0,)


def test_the_deadline_is_checked_again_right_before_each_request(settings: Settings) -> None:
    """A message can wait for a free thread after its call was built: the window may end
    meanwhile. The clock reads inside the window when the call is built and past it at each
    request: rows with the deadline are skipped without a request, rows without one go."""
    cid = uuid.uuid4().int % 10**12
    campaign = LiveCampaign(cid, "sending", 0.0, "Hi {{first_name}}", "+12065550100", None, "c")
    deadline = datetime(2030, 6, 3, 21, tzinfo=UTC)
    readings = iter([deadline - timedelta(seconds=1)])
    channel = SmsChannel(
        SmsSender(make_sms_client(settings)),
        inflight=4,
        is_sending=lambda _: True,
        clock=lambda: next(readings, deadline),
    )
    base = uuid.uuid4().int % 10**5 * 1000
    rows = [
        ClaimedRecipient(
            cid,
            seq,
            seq,
            f"+4479{base + seq:08d}",
            "An",
            attempt=1,
            send_before=deadline if seq <= 6 else None,
        )
        for seq in range(1, 11)
    ]
    try:
        outcome = asyncio.run(channel.send(campaign, rows))
    finally:
        channel.close()
    by_seq = {r.seq: (r.status, r.reason) for r in outcome.final}
    assert by_seq == {
        **{seq: ("skipped", "quiet_hours") for seq in range(1, 7)},
        **{seq: ("sent", None) for seq in range(7, 11)},
    }
    assert len(_texted(settings, cid)) == 4
