"""`flashsend replay` on the real broker and PostgreSQL: the plan, the refusals, the reset, and a
transactional replay that mails nobody twice (real mail worker, SES stand-in)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, Producer

from flashsend.settings import Settings
from producers.campaign import start_campaign
from producers.topics import ensure_topics
from sinks.users import seed_users
from tests.conftest import LocalStack
from tests.integration.campaign_helpers import new_campaign, statuses
from tests.integration.mail_fixtures import (
    address,
    mail_row,
    mail_settings,
    order_codec,
    order_event,
    prepare_topics,
    provider_messages,
    put_templates,
    start_mail_worker,
    stop_process,
    wait_for,
)
from tests.integration.ops_helpers import (
    audit_rows,
    broker_committed,
    cli,
    high_watermarks,
    last_json,
    set_offsets,
    stored_offsets,
)

DAY_MS = 86_400_000


def _live_member(settings: Settings, group: str, topic: str) -> Consumer:
    member = Consumer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
        }
    )
    member.subscribe([topic])
    deadline = time.monotonic() + 30
    while not member.assignment() and time.monotonic() < deadline:
        member.poll(0.2)
    assert member.assignment(), "the stand-in member never joined"
    return member


def test_campaign_replay_plan_refusals_then_reset(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    topic, group = settings.topic_recipients, settings.group_sender
    ensure_topics(settings.kafka_bootstrap, {topic: settings.partitions, settings.topic_dlq: 1})
    seed_users(settings.pg_dsn, 400)
    cid = new_campaign(settings)
    start_campaign(settings, cid, skip_preflight=True)
    high = high_watermarks(settings, topic, settings.partitions)
    # As if a worker had consumed everything and sent the rows of the first 100 seqs.
    set_offsets(settings, group, topic, high)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE campaign_recipients SET status = 'sent', sent_at = now() "
            "WHERE campaign_id = %s AND status = 'pending' AND seq <= 100",
            (cid,),
        )
    counts = statuses(settings, cid)
    args = ("replay", "--group", group, "--topic", topic, "--to-offset", "0")

    code, out = cli(settings, monkeypatch, capsys, *args, "--dry-run", "--json")
    plan = last_json(out)
    assert code == 0 and plan["blocking"] == []
    parts = plan["partitions"]
    assert sum(p["records"] for p in parts) == sum(high.values())
    assert sum(p["would_send"] for p in parts) == counts["pending"]
    assert sum(p["deduplicated"] for p in parts) == counts["sent"]
    assert {p["direction"] for p in parts if p["records"]} == {"rewind"}
    assert stored_offsets(settings, group, topic) == high  # a dry run changes nothing

    member = _live_member(settings, settings.app_id, topic)
    try:
        code, out = cli(settings, monkeypatch, capsys, *args, "--yes", "--reason", "t", "--json")
        assert code == 3 and last_json(out)["blocking"] == ["live_members"]
    finally:
        member.close()

    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute("UPDATE campaigns SET status = 'done' WHERE id = %s", (cid,))
    code, out = cli(settings, monkeypatch, capsys, *args, "--yes", "--reason", "t", "--json")
    assert code == 3 and last_json(out)["blocking"] == ["finished_campaign"]
    assert stored_offsets(settings, group, topic) == high

    # The Kafka group name is accepted too; --i-understand lifts the finished-campaign refusal.
    code, out = cli(
        settings,
        monkeypatch,
        capsys,
        "replay",
        "--group",
        settings.app_id,
        "--topic",
        topic,
        "--to-offset",
        "0",
        "--yes",
        "--i-understand",
        "--reason",
        "INC-1 test",
    )
    assert code == 0, out
    moved = {p for p, h in high.items() if h > 0}
    after = stored_offsets(settings, group, topic)
    assert {p: o for p, o in after.items() if p in moved} == dict.fromkeys(moved, 0)
    some = min(moved)
    assert broker_committed(settings, settings.app_id, topic, some) == 0
    rows = audit_rows(settings, "offset_resets")
    assert {r["partition"] for r in rows} == moved
    assert all(r["forced"] and r["reason"] == "INC-1 test" and r["to_offset"] == 0 for r in rows)
    assert sum(r["would_send"] for r in rows) == 0  # the campaign is done: nothing sends


def test_transactional_target_older_than_dedupe_retention_is_refused(
    stack: LocalStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    s = mail_settings(stack)
    prepare_topics(s)
    codec = order_codec(s)
    now_ms = int(time.time() * 1000)
    producer = Producer({"bootstrap.servers": s.kafka_bootstrap})
    old = order_event("OrderConfirmed", 1, email=address(), occurred_at=now_ms - 9 * DAY_MS)
    producer.produce(
        s.topic_order_events,
        key=b"1",
        value=codec.encode(old),
        partition=0,
        timestamp=now_ms - 9 * DAY_MS,
    )
    for order_id in (2, 3):
        event = order_event("OrderConfirmed", order_id, email=address())
        producer.produce(
            s.topic_order_events, key=str(order_id).encode(), value=codec.encode(event), partition=0
        )
    assert producer.flush(10) == 0
    set_offsets(s, s.group_mail, s.topic_order_events, {0: 3})
    args = (
        "replay",
        "--group",
        s.group_mail,
        "--topic",
        s.topic_order_events,
        "--partitions",
        "0",
        "--dry-run",
        "--json",
    )

    code, out = cli(s, monkeypatch, capsys, *args, "--to-offset", "0")
    plan = last_json(out)
    assert code == 3 and plan["blocking"] == ["too_old"]
    assert plan["partitions"][0]["counts"] == {"ignored": 1, "send": 2}

    code, out = cli(s, monkeypatch, capsys, *args, "--to-offset", "1")
    plan = last_json(out)
    assert code == 0 and plan["partitions"][0]["counts"] == {"send": 2}


def test_transactional_replay_inside_retention_sends_nothing_twice(
    stack: LocalStack,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    s = mail_settings(stack)
    put_templates(s)
    prepare_topics(s)
    codec = order_codec(s)
    emails = {order_id: address("replay") for order_id in range(1, 5)}
    producer = Producer({"bootstrap.servers": s.kafka_bootstrap})
    for order_id, email in emails.items():
        producer.produce(
            s.topic_order_events,
            key=str(order_id).encode(),
            partition=0,
            value=codec.encode(order_event("OrderConfirmed", order_id, email=email)),
        )
    assert producer.flush(10) == 0

    def all_sent() -> bool:
        rows = [mail_row(s, f"order-confirmed:{o}") for o in emails]
        return all(r is not None and r["status"] == "sent" for r in rows)

    worker = start_mail_worker(s, tmp_path)
    try:
        wait_for("the first sends", all_sent, timeout=60)
    finally:
        stop_process(worker)
    assert stored_offsets(s, s.group_mail, s.topic_order_events)[0] == 4

    args = ("replay", "--group", s.group_mail, "--topic", s.topic_order_events, "--to-offset", "0")
    code, out = cli(s, monkeypatch, capsys, *args, "--dry-run", "--json")
    plan = last_json(out)
    assert code == 0
    part0 = next(p for p in plan["partitions"] if p["partition"] == 0)
    assert part0["records"] == 4 and part0["would_send"] == 0 and part0["deduplicated"] == 4
    code, out = cli(s, monkeypatch, capsys, *args, "--yes", "--reason", "verify dedupe")
    assert code == 0, out
    assert stored_offsets(s, s.group_mail, s.topic_order_events)[0] == 0

    worker = start_mail_worker(s, tmp_path)
    try:
        wait_for(
            "the replayed records to be consumed again",
            lambda: stored_offsets(s, s.group_mail, s.topic_order_events)[0] == 4,
            timeout=60,
        )
        time.sleep(1.0)  # a duplicate, if any, would be sent right after the ingest
    finally:
        stop_process(worker)
    for email in emails.values():
        assert len(provider_messages(s, email)) == 1, email
    [audit] = [r for r in audit_rows(s, "offset_resets") if r["partition"] == 0]
    assert (audit["from_offset"], audit["to_offset"], audit["deduplicated"]) == (4, 0, 4)
    assert audit["requested_by"] and audit["reason"] == "verify dedupe"
    assert uuid.UUID(str(audit["replay_id"]))
