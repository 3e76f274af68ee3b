"""The push channel on the real stack: the stand-in's SNS mobile push over HTTP with the real
boto3 `sns` client, real Kafka, PostgreSQL, worker processes, webhook and feedback worker."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from flashsend.lab.chaos import ChaosOptions, run_chaos
from flashsend.lab.demo import SMS_BODY, DemoOptions, run_demo
from flashsend.lab.feedback_run import WebhookProcess, insert_users, with_feedback
from flashsend.lab.push_devices import seed_devices
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from infra.ses_standin.events_admin import SesEventsAdmin
from producers.campaign import start_campaign
from producers.campaign_ops import create_campaign
from producers.push_setup import ensure_applications, register
from producers.reconcile import requeue_after_resume
from producers.resend_unknown import plan_resend
from sinks.campaign_store import CampaignStore
from sinks.push import Notification, PushCallFailed, PushSender, make_push_client
from sinks.users import seed_users
from streams.campaign_state import POLL_INTERVAL_S
from streams.rules.push_message import PushContent, build_message
from tests.integration.campaign_helpers import admin, sql, statuses, wait_finished


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out waiting: {what}")
        time.sleep(0.1)


def test_standin_speaks_sns_mobile_push(settings: Settings) -> None:
    """Real boto3: platform applications and endpoints (CreatePlatformEndpoint idempotent for a
    token), endpoint attributes, Publish with per-platform JSON, EndpointDisabled, the
    account's publish rate answered Throttling, DeleteEndpoint."""
    push = PushSender(make_push_client(settings))
    apps = ensure_applications(settings, push)
    token = f"t-{uuid.uuid4().hex}"
    arn = push.create_endpoint(apps["FCM"], token)
    assert push.create_endpoint(apps["FCM"], token) == arn
    assert push.endpoint_attributes(arn)["Enabled"] == "true"
    campaign = str(uuid.uuid4().int % 10**12)
    content = PushContent("Sale", "Hi {{first_name}}", 60, "sale")
    message, attributes = build_message(
        content, {"first_name": "Ann"}, {"campaign": campaign, "seq": "1"}, "FCM"
    )
    assert push.publish(Notification(arn, message, attributes))
    sent = admin(settings).push_messages(campaign=campaign)
    assert [m["payload"]["notification"]["body"] for m in sent] == ["Hi Ann"]
    assert sent[0]["payload"]["time_to_live"] == 60 and sent[0]["payload"]["collapse_key"] == "sale"

    push.set_endpoint_attributes(arn, {"Enabled": "false"})
    with pytest.raises(PushCallFailed) as disabled:
        push.publish(Notification(arn, message, {}))
    assert disabled.value.code == "EndpointDisabled"

    push.set_endpoint_attributes(arn, {"Enabled": "true"})
    admin(settings).set_faults(mobile_push_mps=3)
    try:
        outcomes = []
        for _ in range(6):
            try:
                push.publish(Notification(arn, message, {}))
                outcomes.append("ok")
            except PushCallFailed as exc:
                outcomes.append(f"{exc.code}:{exc.http_status}")
        assert outcomes.count("ok") == 3 and set(outcomes) == {"ok", "Throttling:400"}, outcomes
    finally:
        admin(settings).set_faults(mobile_push_mps=0)
    push.delete_endpoint(arn)
    with pytest.raises(PushCallFailed) as gone:
        push.endpoint_attributes(arn)
    assert gone.value.code == "NotFound"


def test_push_demo_every_recipient_terminal(settings: Settings) -> None:
    summary = run_demo(
        settings,
        DemoOptions(users=2_000, workers=1, timeout_s=240, show_progress=False, channel="push"),
        log=lambda _: None,
    )
    assert "error" not in summary, summary
    assert summary["status"] == "done"
    assert summary["pending"] == 0 and summary["sending"] == 0 and summary["unknown"] == 0
    assert summary["duplicate_notifications_per_device"] == 0
    assert summary["rows_skipped_endpoint_disabled"] > 0  # disabled here before the run
    assert summary["rows_sent_with_a_device_disabled"] > 0  # disabled at SNS only: learnt
    assert summary["rows_skipped_push_opted_out"] > 0
    assert summary["rows_skipped_without_reason"] == 0
    cid = summary["campaign_id"]
    # One notification per enabled device of each sent row, and none to a disabled one.
    per_row = sql(
        settings,
        "SELECT count(*) FROM campaign_recipients r JOIN device_endpoints e "
        "ON e.id::text = ANY(string_to_array(r.email, ',')) "
        "WHERE r.campaign_id = %s AND r.status = 'sent' AND e.enabled",
        cid,
    )[0][0]
    assert summary["notifications"] == per_row


def test_invalid_token_is_disabled_and_skipped_by_the_next_campaign(
    settings: Settings, tmp_path: Path
) -> None:
    """A campaign notifies a device whose token the platform now calls invalid: SNS accepts,
    the platform refuses, SNS publishes DeliveryFailure to the application's topic; the
    webhook and the feedback worker disable the endpoint in our table; the next campaign
    skips that user with the reason and never publishes to the endpoint again."""
    s = with_feedback(settings, push_send_hours="")
    assert s.ses_endpoint_url
    events = SesEventsAdmin(s.ses_endpoint_url)
    webhook = WebhookProcess.start(s, tmp_path)
    sub = events.subscribe(webhook.sns_url, s.sns_topic_arns[0])
    senders = WorkerPool(s, tmp_path / "senders")
    feedback = WorkerPool(s, tmp_path / "feedback", role="feedback")
    try:
        events.wait_confirmed(sub["id"])
        insert_users(s, 3, f"p{uuid.uuid4().hex[:8]}.test")
        push = PushSender(make_push_client(s))
        apps = ensure_applications(s, push)  # delivery failures to this test's topic
        tag = uuid.uuid4().hex[:8]
        with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
            devices = {
                (u, p): register(s, conn, u, p, f"{tag}-{u}-{p}", sender=push, applications=apps)
                for u in (1, 2, 3)
                for p in ("FCM", "APNS")
                if not (u == 3 and p == "APNS")
            }
        dead_id, dead_arn = devices[(3, "FCM")]  # user 3's only device
        admin(s).push_invalidate(f"{tag}-3-FCM")
        senders.start(1)
        feedback.start(1)
        first = create_campaign(s, name="push-1", template=SMS_BODY, rate=0, channel="push")
        start_campaign(s, first)
        wait_finished(s, first, senders)
        assert statuses(s, first) == {"sent": 3}
        assert len(admin(s).push_messages(endpoint=dead_arn)) == 1  # SNS accepted it once
        wait_for(
            "the feedback worker disables the endpoint",
            lambda: (
                sql(s, "SELECT enabled FROM device_endpoints WHERE id = %s", dead_id)[0][0] is False
            ),
            60,
        )
        assert sql(s, "SELECT disabled_reason FROM device_endpoints WHERE id = %s", dead_id)[0][
            0
        ] == ("push_invalid_token")

        second = create_campaign(s, name="push-2", template=SMS_BODY, rate=0, channel="push")
        start_campaign(s, second)
        wait_finished(s, second, senders)
        rows = dict(
            sql(
                s,
                "SELECT user_id, status || ':' || coalesce(reason, '') FROM campaign_recipients "
                "WHERE campaign_id = %s",
                second,
            )
        )
        assert rows[3] == "skipped:endpoint_disabled:push_invalid_token", rows
        assert rows[1] == rows[2] == "sent:", rows
        assert len(admin(s).push_messages(endpoint=dead_arn)) == 1  # never again
        for key, (_, arn) in devices.items():
            if key != (3, "FCM"):
                assert len(admin(s).push_messages(endpoint=arn)) == 2, key  # once a campaign
    finally:
        senders.stop()
        feedback.stop()
        events.unsubscribe(sub["id"])
        webhook.stop()


def test_push_chaos_kills_and_hangs_keep_the_invariants(settings: Settings) -> None:
    """Workers SIGKILLed every few seconds and some publishes never answered: no device
    notified twice (counted per endpoint at the stand-in), nothing lost, unknown only for rows
    in a call at a kill or without an answer, every skipped row with its reason."""
    result = run_chaos(
        settings,
        ChaosOptions(
            users=2_500,  # ~1,800 rows with devices, ~2,800 publishes at 300/s: several kills
            workers=2,
            rate=300,
            kill_every_s=4,
            ses_hang_rate=0.005,
            lease_s=10,
            timeout_s=240,
            events_wait_s=0,
            channel="push",
        ),
        log=print,
    )
    assert "error" not in result, result["error"]
    assert result["kills"] >= 1, result
    assert result["lost"] == 0, result
    assert result["duplicates"] == 0, admin(settings).push_stats(str(result["campaign_id"]))
    assert result["invariants_failed"] == [] and result["invariants_ok"], json.dumps(
        result, default=str
    )
    assert result["unknown"] <= result["unknown_bound"], result
    # Rows in doubt stay so: a resend would notify twice the devices the call reached.
    plan = plan_resend(settings, result["campaign_id"], older_than_s=0)
    assert plan.refusal is not None and "push campaign" in plan.refusal, plan.refusal


def test_push_pause_stops_within_a_second_and_the_limit_counts_publishes(
    settings: Settings,
) -> None:
    """The campaign's limit counts publishes (devices), not rows: the busiest sliding second
    at the stand-in stays within it. Once `campaign pause` returns, at most the call in flight
    per lane (10 rows of at most 3 devices, 12 lanes) reaches SNS; resumed, the campaign ends
    with every device notified once."""
    seed_users(settings.pg_dsn, 3_000)
    seed_devices(settings, 3_000)
    rate = 300
    cid = create_campaign(
        settings.model_copy(update={"push_send_hours": ""}),
        name="push-pause",
        template=SMS_BODY,
        rate=rate,
        channel="push",
    )
    standin = admin(settings)
    pool = WorkerPool(settings, settings.state_dir / f"logs-push-{cid}")
    pool.start(1)
    try:
        start_campaign(settings, cid)
        deadline = time.monotonic() + 60
        while statuses(settings, cid).get("sent", 0) < 400:
            assert time.monotonic() < deadline, statuses(settings, cid)
            time.sleep(0.1)
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            CampaignStore(conn).transition(cid, "paused", "test paused")
        time.sleep(POLL_INTERVAL_S * 2 + 0.05)  # what `flashsend campaign pause` waits
        returned_at = time.time()
        time.sleep(2.0)
        late = [m for m in standin.push_messages(campaign=str(cid)) if m["at"] > returned_at]
        assert len(late) <= 12 * settings.push_call_size * 3, len(late)
        paused = standin.push_stats(str(cid))["accepted"]
        time.sleep(1.0)
        assert standin.push_stats(str(cid))["accepted"] == paused
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            CampaignStore(conn).transition(cid, "sending", None)
        time.sleep(1.0)  # the worker flags the doorbells it consumed while paused
        requeue_after_resume(settings, cid)
        wait_finished(settings, cid, pool, timeout=120)
    finally:
        pool.stop()
    st = statuses(settings, cid)
    assert st.get("pending", 0) == 0 and st.get("sending", 0) == 0 and st.get("unknown", 0) == 0
    stats = standin.push_stats(str(cid))
    assert stats["duplicates"] == 0 and stats["accepted"] > st["sent"] > 1_500
    assert stats["max_1s_window"] <= rate * 1.02, stats


def test_a_push_row_past_its_quiet_hours_window_is_never_sent(
    settings: Settings, tmp_path: Path
) -> None:
    """Quiet hours as for SMS: planned two days ago in a zone where it was 12:xx then, every
    row was due at once with a deadline (21:00 local that day) long gone when the worker
    reaches it: each row with a device is skipped `quiet_hours`, and SNS gets no publish."""
    s = settings.model_copy(update={"push_send_hours": "08:00-21:00"})
    then = datetime.now(UTC) - timedelta(days=2)
    offset = 12 - then.hour  # hours east of UTC where `then` reads 12:xx
    zone = "UTC" if offset == 0 else f"Etc/GMT{-offset:+d}"
    insert_users(s, 40, f"q{uuid.uuid4().hex[:8]}.test")
    sql(s, "UPDATE users SET timezone = %s", zone)
    seed_devices(s, 40)
    cid = create_campaign(s, name="push too late", template=SMS_BODY, channel="push")
    pool = WorkerPool(s, tmp_path)
    pool.start(1)
    try:
        start_campaign(s, cid, now=then)
        wait_finished(s, cid, pool)
    finally:
        pool.stop()
    rows = dict(
        sql(
            s,
            "SELECT user_id, status || ':' || coalesce(reason, '') FROM campaign_recipients "
            "WHERE campaign_id = %s",
            cid,
        )
    )
    with_device = [
        u for u in range(1, 41) if u % 4 and u % 211 != 3 and not (u % 97 == 1 and u % 4 == 1)
    ]
    assert len(with_device) > 20
    assert {rows[u] for u in with_device} == {"skipped:quiet_hours"}, rows
    assert all(r.startswith("skipped:") for r in rows.values()), rows
    assert admin(s).push_messages(campaign=str(cid)) == []


def test_a_user_who_turns_push_off_after_the_snapshot_is_skipped_at_the_call(
    settings: Settings, tmp_path: Path
) -> None:
    s = settings.model_copy(update={"push_send_hours": ""})
    insert_users(s, 60, f"o{uuid.uuid4().hex[:8]}.test")
    seed_devices(s, 60)
    cid = create_campaign(s, name="push opt-out", template=SMS_BODY, channel="push")
    start_campaign(s, cid)  # snapshot and doorbells; no worker yet
    turned_off = [u for u in range(1, 61) if u % 4 == 2][:8]
    sql(s, "UPDATE users SET push_opt_out = true WHERE id = ANY(%s)", turned_off)
    pool = WorkerPool(s, tmp_path)
    pool.start(1)
    try:
        wait_finished(s, cid, pool)
    finally:
        pool.stop()
    rows = dict(
        sql(
            s,
            "SELECT user_id, status || ':' || coalesce(reason, '') FROM campaign_recipients "
            "WHERE campaign_id = %s",
            cid,
        )
    )
    assert {rows[u] for u in turned_off} == {"skipped:push_opted_out"}, rows
    arns = {
        str(a)
        for (a,) in sql(
            s, "SELECT endpoint_arn FROM device_endpoints WHERE user_id = ANY(%s)", turned_off
        )
    }
    sent_to = {m["endpoint_arn"] for m in admin(s).push_messages(campaign=str(cid))}
    assert sent_to and not arns & sent_to
