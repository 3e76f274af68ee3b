"""The SMS channel on the real stack: the stand-in's pinpoint-sms-voice-v2 over HTTP with the
real boto3 client, real Kafka, PostgreSQL and worker processes."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

from flashsend import metrics
from flashsend.lab.chaos import ChaosOptions, run_chaos
from flashsend.lab.demo import SMS_BODY, DemoOptions, run_demo
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from producers.campaign import snapshot, start_campaign
from producers.campaign_ops import create_campaign
from producers.reconcile import requeue_after_resume
from sinks.campaign_store import CampaignStore
from sinks.recipient_store import ClaimedRecipient, LiveCampaign
from sinks.sms import SmsCallFailed, SmsSender, TextMessage, make_sms_client
from sinks.users import fill_phones, seed_users
from streams.campaign_state import POLL_INTERVAL_S
from streams.rules.phones import normalise_phone, phone_problem
from streams.sms_channel import SmsChannel
from tests.integration.campaign_helpers import admin, sql, statuses, wait_finished


def test_standin_speaks_pinpoint_sms_voice_v2(settings: Settings) -> None:
    """Real boto3 against the stand-in: MessageId; the MPS limit per origination identity
    (throttled beyond it, another identity unaffected); the opt-out list and a STOP reply;
    invalid numbers refused; duplicates per number and segments in the admin stats."""
    sms = SmsSender(make_sms_client(settings))
    ses = admin(settings)
    campaign = str(uuid.uuid4().int % 10**12)
    base = uuid.uuid4().int % 10**6 * 1000

    def text(n: int, origin: str = "+12065550100", body: str = "hello") -> str:
        return sms.send_text(
            TextMessage(f"+4479{base + n:08d}", body, origin, "cs", {"campaign": campaign})
        )

    assert text(0)
    text(0)  # a second message to one number: the stand-in counts a duplicate
    text(1, body="€" * 100)  # GSM-7 extension: 200 septets, 2 segments
    text(2, body="Chào bạn")  # UCS-2, 1 segment
    stats = ses.sms_stats(campaign)
    assert stats["accepted"] == 4 and stats["duplicates"] == 1
    assert stats["segments"] == 1 + 1 + 2 + 1

    ses.set_faults(sms_mps=5)
    try:
        origin = f"+1206{base:07d}"
        outcomes = []
        for n in range(10, 18):
            try:
                text(n, origin=origin)
                outcomes.append("ok")
            except SmsCallFailed as exc:
                outcomes.append(f"{exc.code}:{exc.http_status}")
        assert outcomes.count("ok") == 5, outcomes
        assert set(outcomes) == {"ok", "ThrottlingException:400"}
        text(30, origin=f"+1207{base:07d}")  # another identity has its own budget
    finally:
        ses.set_faults(sms_mps=0)

    stopper = f"+4479{base + 40:08d}"
    text(40)
    reply = ses.sms_inbound(stopper, "Stop ")
    assert reply["optedOut"] and reply["messageKeyword"] == "STOP"
    assert stopper in set(sms.opted_out_numbers("Default"))
    with pytest.raises(SmsCallFailed) as refused:
        text(40)
    assert refused.value.code == "ConflictException"
    assert refused.value.reason == "DESTINATION_PHONE_NUMBER_OPTED_OUT"
    with pytest.raises(SmsCallFailed) as invalid:
        sms.send_text(TextMessage("0912345678", "x", "+12065550100", None, {}))
    assert invalid.value.code == "ValidationException"


# Spellings the snapshot's SQL and streams.rules.phones must judge alike.
PHONES = [
    "+84 912 345 601",
    "+1 (206) 555-0100",
    "0084912345602",
    "+84.912.345.603",
    "0912345678",
    "+0912345678",
    "+84 12",
    "+1234567",
    "+12345678",
    "+123456789012345",
    "+1234567890123456",
    "call me",
    "",
    " +84912345679 ",
    "+84\t912345670",
    "+８４912345671",
    "+84-912-345-671x",
]


def test_snapshot_and_sender_agree_on_numbers(settings: Settings) -> None:
    """The SMS snapshot's SQL normalises and validates numbers as streams.rules.phones does:
    invalid ones skipped `invalid_phone`, a number two users share sent once."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        for i, phone in enumerate([*PHONES, None, "+84912345601"], start=1):
            conn.execute(
                "INSERT INTO users (id, email, phone) VALUES (%s, %s, %s)",
                (i, f"u{i}@mail.flashsend.test", phone),
            )
        cid = create_campaign(settings, name="phones", template="hi", channel="sms")
        snapshot(conn, cid, settings.audience_condition)
        rows = {
            r[0]: (r[1], r[2], r[3])
            for r in conn.execute(
                "SELECT user_id, email, status, reason FROM campaign_recipients "
                "WHERE campaign_id = %s",
                (cid,),
            )
        }
    for i, phone in enumerate(PHONES, start=1):
        number = normalise_phone(phone)
        valid = phone_problem(number) is None
        address, status, reason = rows[i]
        assert (status, reason) == (("pending", None) if valid else ("skipped", "invalid_phone")), (
            phone,
            rows[i],
        )
        assert address == number, phone
    assert rows[len(PHONES) + 1] == ("", "skipped", "invalid_phone")  # no phone at all
    assert rows[len(PHONES) + 2] == ("+84912345601", "skipped", "duplicate_address")


def test_sms_demo_every_recipient_terminal(settings: Settings) -> None:
    summary = run_demo(
        settings,
        DemoOptions(users=3_000, workers=1, timeout_s=240, show_progress=False, channel="sms"),
        log=lambda _: None,
    )
    assert "error" not in summary, summary
    assert summary["status"] == "done"
    assert summary["pending"] == 0 and summary["sending"] == 0
    assert summary["unknown"] == 0 and summary["failed"] == 0
    assert summary["duplicates"] == 0
    assert summary["sent"] == summary["accepted_by_ses"] > 2_000
    assert summary["segments"] == summary["sent"]  # the demo's body is one GSM-7 segment
    cid = summary["campaign_id"]
    with psycopg.connect(settings.pg_dsn) as conn:
        invalid = conn.execute(
            "SELECT email FROM campaign_recipients WHERE campaign_id = %s "
            "AND status = 'skipped' AND reason = 'invalid_phone'",
            (cid,),
        ).fetchall()
    assert len(invalid) >= 5  # 0.2 % of 3,000 users, some of them inactive or opted out
    texted = {m["destination"] for m in admin(settings).sms_messages(campaign=str(cid))}
    assert len(texted) == summary["sent"]
    assert not texted & {normalise_phone(r[0]) for r in invalid}


def test_stop_suppresses_the_number_for_the_next_campaign(settings: Settings) -> None:
    seed_users(settings.pg_dsn, 300)
    fill_phones(settings.pg_dsn, 300)
    ses = admin(settings)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        # Numbers of their own: the stand-in (and its opt-out list) is the session's.
        prefix = f"+33{uuid.uuid4().int % 10**5:05d}"
        conn.execute("UPDATE users SET phone = %s || lpad(id::text, 4, '0')", (prefix,))
    pool = WorkerPool(settings, settings.state_dir / f"logs-sms-{uuid.uuid4().hex[:6]}")
    pool.start(1)
    try:
        first = create_campaign(settings, name="sms-1", template=SMS_BODY, rate=0, channel="sms")
        start_campaign(settings, first)
        wait_finished(settings, first, pool)
        with psycopg.connect(settings.pg_dsn) as conn:
            sent = conn.execute(
                "SELECT user_id, email FROM campaign_recipients WHERE campaign_id = %s "
                "AND status = 'sent' ORDER BY user_id LIMIT 2",
                (first,),
            ).fetchall()
        (stopper_id, stopper), (_, other) = sent
        assert ses.sms_messages(destination=stopper, campaign=str(first))
        ses.sms_inbound(stopper, "STOP", to=settings.sms_origination_identity)

        second = create_campaign(settings, name="sms-2", template=SMS_BODY, rate=0, channel="sms")
        start_campaign(settings, second)
        wait_finished(settings, second, pool)
    finally:
        pool.stop()
    assert ses.sms_messages(destination=stopper, campaign=str(second)) == []
    assert len(ses.sms_messages(destination=other, campaign=str(second))) == 1
    with psycopg.connect(settings.pg_dsn) as conn:
        row = conn.execute(
            "SELECT reason FROM email_suppressions WHERE email = %s", (stopper,)
        ).fetchone()
        in_second = conn.execute(
            "SELECT count(*) FROM campaign_recipients WHERE campaign_id = %s AND user_id = %s",
            (second, stopper_id),
        ).fetchone()
    assert row == ("sms_opt_out",)
    assert in_second == (0,)
    counts = statuses(settings, second)
    assert counts.get("pending", 0) == 0 and counts.get("sending", 0) == 0
    assert ses.sms_stats(str(second))["duplicates"] == 0
    assert counts["sent"] == statuses(settings, first)["sent"] - 1


def _rows(campaign_id: int, count: int, base: int) -> list[ClaimedRecipient]:
    return [
        ClaimedRecipient(campaign_id, seq, seq, f"+4478{base + seq:08d}", "An", attempt=1)
        for seq in range(1, count + 1)
    ]


def test_a_fresh_worker_builds_one_sms_client_for_its_first_concurrent_messages(
    settings: Settings,
) -> None:
    """The client is built at the first message, in the executor's threads: 16 messages at
    once build it once (16 clients took 1.8 s of GIL-bound model loading while their rows
    were in a call), and every message goes out through it."""
    built: list[SmsSender] = []

    def build() -> SmsSender:
        time.sleep(0.2)  # a slow build widens the race it guards
        built.append(SmsSender(make_sms_client(settings)))
        return built[-1]

    cid = uuid.uuid4().int % 10**12
    campaign = LiveCampaign(cid, "sending", 0.0, "Hi {{first_name}}", "+12065550100", None, "c")
    channel = SmsChannel(build, inflight=16, is_sending=lambda _: True)
    try:
        outcome = asyncio.run(channel.send(campaign, _rows(cid, 16, uuid.uuid4().int % 10**5)))
    finally:
        channel.close()
    assert len(built) == 1
    assert sorted(r.status for r in outcome.final) == ["sent"] * 16
    assert admin(settings).sms_stats(str(cid))["accepted"] == 16


class CountingSender(SmsSender):
    """The real sender, counting the calls open at once."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self._lock = threading.Lock()
        self._open = 0
        self.most_at_once = 0

    def send_text(self, message: TextMessage) -> str:
        with self._lock:
            self._open += 1
            self.most_at_once = max(self.most_at_once, self._open)
        try:
            return super().send_text(message)
        finally:
            with self._lock:
                self._open -= 1


def test_a_lane_call_sends_its_messages_concurrently(settings: Settings) -> None:
    """One SendTextMessage per row, and the rows of one lane call in flight together (up to
    `inflight` at once, never more): with 100 ms per call at the provider the calls overlap.
    A campaign that stops sending stops the messages not yet started (they go back to the
    lane), and an invalid number is skipped without a call."""
    ses = admin(settings)
    cid = uuid.uuid4().int % 10**12
    campaign = LiveCampaign(cid, "sending", 0.0, "Hi {{first_name}}", "+12065550100", None, "c")
    sending = {cid: True}
    sender = CountingSender(make_sms_client(settings))
    channel = SmsChannel(sender, inflight=16, is_sending=lambda c: sending[c])
    base = uuid.uuid4().int % 10**6 * 100
    rows = _rows(cid, 32, base)
    bad = ClaimedRecipient(cid, 99, 99, "0912 345 678", None, attempt=1)
    ses.set_faults(latency_ms=100)
    try:
        outcome = asyncio.run(channel.send(campaign, [*rows, bad]))
        sending[cid] = False
        stopped = asyncio.run(channel.send(campaign, _rows(cid, 5, base + 50)))
    finally:
        ses.set_faults(latency_ms=0)
        channel.close()
    sent = [r for r in outcome.final if r.status == "sent"]
    assert len(sent) == 32 and all(r.message_id for r in sent)
    assert [(r.seq, r.status, r.reason) for r in outcome.final if r.seq == 99] == [
        (99, "skipped", "invalid_phone:no_country_code")
    ]
    # One after another, never two calls would be open at once; the bound is `inflight`.
    assert 1 < sender.most_at_once <= 16, sender.most_at_once
    assert len(stopped.retry) == 5 and stopped.final == []
    assert ses.sms_stats(str(cid))["accepted"] == 32
    assert ses.sms_messages(campaign=str(cid))[0]["body"] == "Hi An"
    counted = metrics.REGISTRY.get_sample_value(
        "flashsend_sms_segments_total", {"campaign": str(cid)}
    )
    assert counted == 32  # one segment each


def test_sms_chaos_kills_and_hangs_keep_the_invariants(settings: Settings) -> None:
    """Workers SIGKILLed every few seconds and some calls never answered: nothing sent twice
    (counted at the stand-in), nothing lost, unknown only for rows in a call at a kill or
    without an answer."""
    result = run_chaos(
        settings,
        ChaosOptions(
            users=4_000,  # ~3,500 recipients at 250/s: ~14 s of sending, several kills
            workers=2,
            rate=250,
            kill_every_s=4,
            ses_hang_rate=0.005,
            lease_s=10,
            timeout_s=240,
            events_wait_s=0,
            channel="sms",
        ),
        log=print,
    )
    assert "error" not in result, result["error"]
    assert result["kills"] >= 1, result
    assert result["lost"] == 0, result
    assert result["duplicates"] == 0, _duplicates_detail(settings, result["campaign_id"])
    assert result["invariants_failed"] == [] and result["invariants_ok"], json.dumps(
        result, default=str
    )
    assert result["unknown"] <= result["unknown_bound"], result
    assert result["accepted_by_ses"] >= result["sent"] > 3_000, result


def _duplicates_detail(settings: Settings, campaign_id: int) -> str:
    """What a duplicate text needs to be traced: each number texted twice, the stand-in's
    messages to it and the campaign's rows for it (their claims and outcome)."""
    cid = str(campaign_id)
    standin = admin(settings)
    numbers = standin.sms_stats(campaign=cid).get("duplicate_destinations", [])
    detail: dict[str, object] = {}
    rows = sql(
        settings,
        "SELECT seq, email, status, reason, attempts, claimed_at, in_call_at, sent_at, "
        "message_id FROM campaign_recipients WHERE campaign_id = %s",
        campaign_id,
    )
    for number in numbers:
        detail[number] = {
            "texts": standin.sms_messages(destination=number, campaign=cid),
            "rows": [r for r in rows if normalise_phone(r[1]) == number],
        }
    return json.dumps(detail, default=str)


def test_sms_pause_stops_texts_within_a_second_and_resume_loses_nothing(
    settings: Settings,
) -> None:
    """Once `campaign pause` returns, at most the call in flight per lane (10 messages, 12
    lanes) reaches the provider; resumed, the campaign ends with every number texted once."""
    seed_users(settings.pg_dsn, 4_000)
    fill_phones(settings.pg_dsn, 4_000)
    cid = create_campaign(settings, name="sms-pause", template=SMS_BODY, rate=400, channel="sms")
    ses = admin(settings)
    pool = WorkerPool(settings, settings.state_dir / f"logs-sms-{cid}")
    pool.start(1)
    try:
        start_campaign(settings, cid)
        deadline = time.monotonic() + 60
        while statuses(settings, cid).get("sent", 0) < 800:
            assert time.monotonic() < deadline, statuses(settings, cid)
            time.sleep(0.1)
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            CampaignStore(conn).transition(cid, "paused", "test paused")
        time.sleep(POLL_INTERVAL_S * 2 + 0.05)  # what `flashsend campaign pause` waits
        returned_at = time.time()
        time.sleep(2.0)
        late = [m for m in ses.sms_messages(campaign=str(cid)) if m["at"] > returned_at]
        assert len(late) <= 12 * settings.sms_call_size, len(late)
        paused_sent = statuses(settings, cid).get("sent", 0)
        time.sleep(1.0)
        assert statuses(settings, cid).get("sent", 0) == paused_sent
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            CampaignStore(conn).transition(cid, "sending", None)
        time.sleep(1.0)  # the worker flags the doorbells it consumed while paused
        requeue_after_resume(settings, cid)
        wait_finished(settings, cid, pool, timeout=120)
    finally:
        pool.stop()
    st = statuses(settings, cid)
    assert st.get("pending", 0) == 0 and st.get("sending", 0) == 0 and st.get("unknown", 0) == 0
    s = ses.sms_stats(str(cid))
    assert s["duplicates"] == 0 and s["accepted"] == st["sent"] > 3_000
