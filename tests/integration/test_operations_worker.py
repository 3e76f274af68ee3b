"""A real campaign worker (`flashsend worker`): /metrics moves while a campaign sends, and a
dead letter replayed after its cause is fixed is sent once — and only once, replayed twice."""

from __future__ import annotations

import re
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from infra.process import free_port
from producers.campaign import start_campaign
from producers.dlq_replay import read_letters
from producers.topics import ensure_topics
from schemas.serde import AvroCodec, registry_client
from sinks.recipient_partitions import create_partition
from sinks.users import seed_users
from tests.conftest import LocalStack
from tests.integration.campaign_helpers import admin, new_campaign, wait_finished
from tests.integration.mail_fixtures import wait_for
from tests.integration.ops_helpers import audit_rows, cli, last_json

_SAMPLE = re.compile(r"^([a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$")


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            out[match[1] + (match[2] or "")] = float(match[3])
    return out


def total(samples: dict[str, float], prefix: str, *parts: str) -> float:
    return sum(v for k, v in samples.items() if k.startswith(prefix) and all(p in k for p in parts))


def test_metrics_move_during_a_campaign_and_dlq_replay_after_the_fix(
    stack: LocalStack,
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    port = free_port()
    s = stack.settings_for(**{**settings.model_dump(), "metrics_port": port})
    ensure_topics(s.kafka_bootstrap, {s.topic_recipients: s.partitions, s.topic_dlq: 1})
    seed_users(s.pg_dsn, 3_000)
    pool = WorkerPool(s, tmp_path / "logs")
    pool.start(1)
    try:
        wait_for("the worker's /metrics", lambda: _up(port), timeout=60)
        cid = new_campaign(s, rate=600)
        start_campaign(s, cid, skip_preflight=True)
        label = f'campaign="{cid}"'
        first = wait_for("sends", lambda: _sent(port, label), timeout=60)
        time.sleep(1.5)
        samples = scrape(port)
        assert total(samples, "flashsend_recipients_total", label, 'status="sent"') > first
        assert total(samples, "flashsend_ses_call_seconds_count", "SendBulkEmail") > 0
        assert total(samples, "flashsend_ses_calls_total", 'result="ok"') > 0
        assert total(samples, "flashsend_throttle_wait_seconds_total") > 0
        assert any(k.startswith("flashsend_consumer_lag{") for k in samples)
        progress = wait_finished(s, cid, pool, timeout=60)
        assert progress["sent"] > 2000

        # A doorbell for a campaign that does not exist (yet) is dead-lettered at once.
        ghost, email = 987_654_321, _active_email(s)
        codec = AvroCodec(registry_client(s.schema_registry_url), "campaign_recipient")
        producer = Producer({"bootstrap.servers": s.kafka_bootstrap})
        producer.produce(
            s.topic_recipients,
            key=b"1",
            partition=0,
            value=codec.encode({"campaign_id": ghost, "seq": 1, "user_id": 1, "produced_at_ms": 0}),
            headers=[("traceparent", TRACE), ("flashsend.schema", b"campaign_recipient")],
        )
        assert producer.flush(10) == 0
        wait_for("the dead letter", lambda: read_letters(s), timeout=30)
        code, out = cli(s, monkeypatch, capsys, "dlq", "show", "0", "--json")
        shown = last_json(out)
        assert code == 0 and shown["reason"] == "unknown_campaign"
        assert shown["headers"]["traceparent"] == TRACE.decode()  # the record's own, kept
        assert shown["decoded"]["campaign_id"] == ghost
        assert total(scrape(port), "flashsend_dead_letters_total", "unknown_campaign") == 1

        # The stand-in is shared by the whole test session: count only this campaign's mail.
        def ghost_mail() -> int:
            return sum(
                1
                for m in admin(s).messages(destination=email, limit=100_000)
                if m["tags"].get("campaign") == str(ghost)
            )

        before = ghost_mail()
        _create_campaign(s, ghost, email)  # the fix: the campaign now exists
        code, out = cli(
            s,
            monkeypatch,
            capsys,
            "dlq",
            "replay",
            "--all",
            "--yes",
            "--reason",
            "campaign imported",
        )
        assert code == 0, out
        wait_for("the replayed recipient", lambda: _row_status(s, ghost) == "sent", timeout=30)
        code, out = cli(
            s, monkeypatch, capsys, "dlq", "replay", "--all", "--yes", "--reason", "again"
        )
        assert "0 letter(s) to replay; 1 already replayed" in out
        code, out = cli(
            s,
            monkeypatch,
            capsys,
            "dlq",
            "replay",
            "0",
            "--again",
            "--yes",
            "--reason",
            "twice on purpose",
        )
        assert code == 0
        time.sleep(2.0)  # the second copy is consumed and deduplicated (row already sent)
        assert ghost_mail() == before + 1
        rows = audit_rows(s, "dlq_replays")
        assert [r["reason"] for r in rows] == ["campaign imported", "twice on purpose"]
        assert rows[0]["dead_reason"] == "unknown_campaign"
        assert rows[0]["target_topic"] == s.topic_recipients
        # The replayed copy carries the record's own headers again, not the dead letter's.
        copy = _record_at(s, rows[0]["target_partition"], rows[0]["new_offset"])
        assert copy == [
            ("traceparent", TRACE),
            ("flashsend.schema", b"campaign_recipient"),
            ("flashsend.replayed_from", f"{s.topic_dlq}@0:0".encode()),
        ]
    finally:
        pool.stop()


TRACE = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def _record_at(s: Settings, partition: int, offset: int) -> list[tuple[str, bytes | None]]:
    consumer = Consumer(
        {"bootstrap.servers": s.kafka_bootstrap, "group.id": "t-read", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition(s.topic_recipients, partition, offset)])
        msg = consumer.poll(10)
        assert msg is not None and msg.error() is None and msg.offset() == offset
        return list(msg.headers() or [])
    finally:
        consumer.close()


def _up(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


def _sent(port: int, label: str) -> float:
    return total(scrape(port), "flashsend_recipients_total", label, 'status="sent"')


def _active_email(s: Settings) -> str:
    with psycopg.connect(s.pg_dsn) as conn:
        row = conn.execute(
            "SELECT email FROM users WHERE id = 1 AND status = 'active' AND marketing_opt_in "
            "AND email LIKE '%%@%%.%%'"
        ).fetchone()
    if row is None:
        with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE users SET status = 'active', marketing_opt_in = true, "
                "email = 'ghost-1@example.com' WHERE id = 1"
            )
        return "ghost-1@example.com"
    return str(row[0])


def _create_campaign(s: Settings, campaign_id: int, email: str) -> None:
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO campaigns (id, name, template, from_address, configuration_set, "
            "rate_limit, audience_condition, status, recipients) "
            "SELECT %s, 'imported', template, from_address, configuration_set, rate_limit, "
            "audience_condition, 'sending', 1 FROM campaigns LIMIT 1",
            (campaign_id,),
        )
        create_partition(conn, campaign_id)
        conn.execute(
            "INSERT INTO campaign_recipients (campaign_id, seq, user_id, email) "
            "VALUES (%s, 1, 1, %s)",
            (campaign_id, email),
        )


def _row_status(s: Settings, campaign_id: int) -> str | None:
    with psycopg.connect(s.pg_dsn) as conn:
        row = conn.execute(
            "SELECT status FROM campaign_recipients WHERE campaign_id = %s", (campaign_id,)
        ).fetchone()
    return None if row is None else str(row[0])
