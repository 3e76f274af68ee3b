"""Architecture 2 end to end: order service (own database) → outbox → relay → order.events →
the mail service as a real `flashsend worker --role mail` process (own database) → SES
stand-in → lifecycle events → mail.events → the order service's consumer.

One mail worker serves the whole module (starting Faust costs seconds); every test uses its
own orders and addresses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from flashsend.settings import Settings, settings_env
from infra.process import free_port
from producers.mail_topics import ensure_mail_topics
from sinks.mail_enqueue import enqueue_mail
from sinks.order_store import NewOrder, cancel_order, order_with_emails, place_order
from streams.order_feedback import OrderFeedback
from tests.conftest import LocalStack
from tests.integration.mail_fixtures import (
    Background,
    address,
    lifecycle,
    mail_row,
    mail_settings,
    order_codec,
    order_event,
    order_relay,
    produce,
    provider_messages,
    put_templates,
    read_topic,
    start_mail_worker,
    stop_process,
    wait_for,
)


@dataclass
class Env:
    settings: Settings
    worker: subprocess.Popen[bytes]
    log_dir: Path
    relay: Background | None = None
    feedback: Background | None = None

    def start_relay(self) -> None:
        self.relay = Background(order_relay(self.settings).run, "order-relay")

    def stop_relay(self) -> None:
        if self.relay is not None:
            self.relay.stop()
            self.relay = None

    def log(self) -> str:
        return (self.log_dir / "mail-worker.log").read_text(errors="replace")[-4000:]


# One worker runs this module: its module fixture is a process of its own.
pytestmark = pytest.mark.xdist_group("mail_service")


@pytest.fixture(scope="module")
def env(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    settings = mail_settings(stack)
    put_templates(settings)
    ensure_mail_topics(settings)
    log_dir = tmp_path_factory.mktemp("mail-logs")
    e = Env(settings, start_mail_worker(settings, log_dir), log_dir)
    e.start_relay()
    e.feedback = Background(OrderFeedback(settings).run, "order-feedback")
    try:
        yield e
    finally:
        e.stop_relay()
        e.feedback.stop()
        stop_process(e.worker)


def place(env: Env, **kw: Any) -> tuple[int, str]:
    to = address("order")
    with psycopg.connect(env.settings.orders_pg_dsn) as conn, conn.transaction():
        placed = place_order(
            conn,
            NewOrder(email=to, customer_name="Lan", total=Decimal("99"), **kw),
            topic=env.settings.topic_order_events,
        )
    return placed.order_id, to


def wait_mail(env: Env, key: str, status: str, timeout: float = 60.0) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        assert env.worker.poll() is None, f"mail worker exited:\n{env.log()}"
        row = mail_row(env.settings, key)
        return row if row and row["status"] == status else None

    return wait_for(f"{key} {status}", check, timeout)  # type: ignore[no-any-return]


def order_emails(env: Env, order_id: int) -> list[dict[str, Any]]:
    with psycopg.connect(env.settings.orders_pg_dsn) as conn:
        return list(order_with_emails(conn, order_id)["emails"])


def wait_consumed(env: Env, timeout: float = 30.0) -> None:
    """Until the mail service's stored offsets reach the end of every order.events partition."""
    s = env.settings
    consumer = Consumer({"bootstrap.servers": s.kafka_bootstrap, "group.id": "watermarks"})
    try:

        def done() -> bool:
            high = sum(
                consumer.get_watermark_offsets(TopicPartition(s.topic_order_events, p), timeout=5)[
                    1
                ]
                for p in range(s.order_events_partitions)
            )
            with psycopg.connect(s.pg_dsn) as conn:
                row = conn.execute(
                    "SELECT coalesce(sum(next_offset), 0) FROM kafka_offsets WHERE group_id = %s",
                    (s.group_mail,),
                ).fetchone()
            return row is not None and int(row[0]) >= high

        wait_for("order.events consumed", done, timeout)
    finally:
        consumer.close()


def test_order_confirmation_end_to_end(env: Env) -> None:
    order_id, to = place(env)
    row = wait_mail(env, f"order-confirmed:{order_id}", "sent")
    (msg,) = provider_messages(env.settings, to)
    assert msg["message_id"] == row["provider_id"]
    assert msg["headers"].get("X-Flashsend-Dedupe-Key") == f"order-confirmed:{order_id}"
    assert msg["configuration_set"] == env.settings.transactional_configuration_set
    emails = wait_for(
        "EmailSent at the order service",
        lambda: [e for e in order_emails(env, order_id) if e["status"] == "sent"],
    )
    assert emails[0]["message_id"] == row["provider_id"]


def test_relay_crash_after_publish_before_mark_sends_once(env: Env) -> None:
    """Trap 2/3 + stage 1: the relay published, then died before marking the row. The row
    is published again with the SAME event_id (a new offset): the mail service creates
    nothing new and the customer gets one mail."""
    order_id, to = place(env)
    key = f"order-confirmed:{order_id}"
    wait_mail(env, key, "sent")
    with psycopg.connect(env.settings.orders_pg_dsn) as conn:
        conn.execute("UPDATE outbox SET published_at = NULL WHERE dedupe_key = %s", (key,))

    def republished() -> bool:
        with psycopg.connect(env.settings.orders_pg_dsn) as conn:
            row = conn.execute(
                "SELECT published_at FROM outbox WHERE dedupe_key = %s", (key,)
            ).fetchone()
        return row is not None and row[0] is not None

    wait_for("republished", republished)
    wait_consumed(env)
    codec = order_codec(env.settings)
    ids = [
        codec.decode(m.value())["event_id"]
        for m in read_topic(env.settings, env.settings.topic_order_events, 100, timeout=5)
        if int(m.key()) == order_id
    ]
    assert len(ids) == 2 and ids[0] == ids[1]
    assert len(provider_messages(env.settings, to)) == 1


def test_broker_down_at_commit_mail_still_sent_later(env: Env) -> None:
    """Architecture-1 trap 1 / stage 1: Kafka is unreachable when the order commits. The
    order commits anyway (the event is in the outbox), the relay cannot publish, and the mail
    goes once a broker answers — nothing lost, nothing waited on in the request."""
    env.stop_relay()
    try:
        order_id, to = place(env)
        down = mail_settings_like(env.settings, kafka_bootstrap=f"127.0.0.1:{free_port()}")
        relay = order_relay(down, publish_timeout_s=1.0)
        try:
            assert relay.acquire()
            result = relay.run_once()
            assert result.transient and result.published == 0
        finally:
            relay.close()
        time.sleep(1.0)
        assert mail_row(env.settings, f"order-confirmed:{order_id}") is None
    finally:
        env.start_relay()
    wait_mail(env, f"order-confirmed:{order_id}", "sent")
    assert len(provider_messages(env.settings, to)) == 1


def mail_settings_like(settings: Settings, **overrides: Any) -> Settings:
    data = settings.model_dump()
    data.update(overrides)
    return Settings(**data)


def test_cancel_before_send_reported_back(env: Env) -> None:
    """A delayed confirmation (send_after +60 s) cancelled before its time: never sent, the
    order service learns EmailCancelled asynchronously (it never claimed so itself)."""
    order_id, to = place(env, send_after_ms=int((time.time() + 60) * 1000))
    key = f"order-confirmed:{order_id}"
    wait_mail(env, key, "pending")
    with psycopg.connect(env.settings.orders_pg_dsn) as conn, conn.transaction():
        assert cancel_order(conn, order_id, topic=env.settings.topic_order_events)
        assert order_with_emails(conn, order_id)["emails"] == []  # outcome not known yet
    wait_mail(env, key, "cancelled")
    wait_for(
        "EmailCancelled at the order service",
        lambda: [e for e in order_emails(env, order_id) if e["cancel_outcome"] == "cancelled"],
    )
    assert provider_messages(env.settings, to) == []


def test_cancel_event_arrives_before_create_event(env: Env) -> None:
    """Cancel trap 1: OrderCancelled overtakes OrderConfirmed (DLQ replay, two relays). The
    tombstone swallows the late create: no mail for a cancelled order."""
    codec = order_codec(env.settings)
    order_id, to = 900_000 + int(time.time()) % 100_000, address("tomb")
    cancel = order_event("OrderCancelled", order_id)
    confirm = order_event("OrderConfirmed", order_id, email=to)
    produce(
        env.settings,
        [
            (str(order_id).encode(), codec.encode(cancel)),
            (str(order_id).encode(), codec.encode(confirm)),
        ],
    )
    wait_consumed(env)
    row = mail_row(env.settings, f"order-confirmed:{order_id}")
    assert row and row["status"] == "cancelled" and row["event_id"] is None
    assert lifecycle(env.settings, f"order-confirmed:{order_id}") == ["EmailCancelled"]
    time.sleep(1.0)
    assert provider_messages(env.settings, to) == []


def test_poison_goes_to_dlq_and_the_partition_keeps_flowing(env: Env) -> None:
    """Trap 5/6: garbage, an unknown version, an unknown type and fields outside their domain
    (occurred_at 1e18, which raised in the agent: a crash loop; a non-UUID event_id, which
    failed the uuid column and was retried forever; send_after in microseconds) go to the DLQ
    at once; a stale confirmation (the replay trap) creates no mail but is recorded and shown
    by `flashsend mail status`; a cancel three days old is applied (its delayed mail never
    goes); the valid event behind them all is mailed."""
    codec = order_codec(env.settings)
    base = 800_000 + int(time.time()) % 100_000
    good_to, stale_to, delayed_to = address("good"), address("stale"), address("delayed")
    now_ms = int(time.time() * 1000)
    three_days_ago = now_ms - 3 * 86_400_000
    produce(
        env.settings,
        [
            (b"x", b"not avro at all"),
            (b"x", codec.encode(order_event("OrderConfirmed", base, email=address(), version=2))),
            (b"x", codec.encode(order_event("OrderShipped", base + 1))),
            (
                b"x",
                codec.encode(
                    order_event(
                        "OrderConfirmed", base + 2, email=stale_to, occurred_at=three_days_ago
                    )
                ),
            ),
            (b"x", codec.encode(order_event("OrderConfirmed", base + 4, occurred_at=10**18))),
            (b"x", codec.encode(order_event("OrderConfirmed", base + 5, event_id="order-5"))),
            (
                b"x",
                codec.encode(
                    order_event(
                        "OrderConfirmed", base + 6, email=address(), send_after=now_ms * 1000
                    )
                ),
            ),
            (
                b"x",
                codec.encode(
                    order_event(
                        "OrderConfirmed", base + 7, email=delayed_to, send_after=now_ms + 600_000
                    )
                ),
            ),
            (
                b"x",
                codec.encode(order_event("OrderCancelled", base + 7, occurred_at=three_days_ago)),
            ),
            (b"x", codec.encode(order_event("OrderConfirmed", base + 3, email=good_to))),
        ],
        partition=1,
    )
    wait_mail(env, f"order-confirmed:{base + 3}", "sent")
    reasons = sorted(
        dict(m.headers())["flashsend.reason"].decode()
        for m in read_topic(env.settings, env.settings.topic_dlq, 6)
    )
    assert reasons == [
        "bad_event_id",
        "bad_timestamp",
        "bad_timestamp",
        "not_avro",
        "unknown_event_type",
        "unsupported_version",
    ]
    assert mail_row(env.settings, f"order-confirmed:{base + 2}") is None
    assert provider_messages(env.settings, stale_to) == []
    delayed = mail_row(env.settings, f"order-confirmed:{base + 7}")
    assert delayed is not None and delayed["status"] == "cancelled"
    assert provider_messages(env.settings, delayed_to) == []
    with psycopg.connect(env.settings.pg_dsn) as conn:
        stale = conn.execute(
            "SELECT event_type, age_s FROM mail_stale_events WHERE dedupe_key = %s",
            (f"order-confirmed:{base + 2}",),
        ).fetchall()
    assert len(stale) == 1 and stale[0][0] == "OrderConfirmed" and stale[0][1] > 2.9 * 86_400
    shown = cli(env, "mail", "status", f"order-confirmed:{base + 2}")
    assert "no mail: every event for it arrived too old to act on" in shown, shown
    overview = cli(env, "mail", "status")
    assert "stale confirmations" in overview and "0 in the last day" not in overview, overview


def cli(env: Env, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "flashsend.cli", *args],
        env={**os.environ, **settings_env(env.settings)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_monolith_row_and_database_outage(env: Env) -> None:
    """enqueue_mail() in the mail database (monolith) is picked up by the running worker via
    its doorbell. Then the database goes away for a while: the worker retries (a transient
    error, not poison) and the event produced meanwhile is mailed once it is back."""
    s = env.settings
    to = address("mono")
    with psycopg.connect(s.pg_dsn) as conn, conn.transaction():
        enqueue_mail(conn, "welcome:mono-1", to, "order_confirmation", {"order_id": 0})
    wait_mail(env, "welcome:mono-1", "sent", timeout=15)
    admin_dsn = s.pg_dsn_for("postgres")
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{s.pg_database}" ALLOW_CONNECTIONS false')
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            (s.pg_database,),
        )
        try:
            order_id, to = place(env)
            time.sleep(3.0)
            assert env.worker.poll() is None, f"mail worker died:\n{env.log()}"
        finally:
            conn.execute(f'ALTER DATABASE "{s.pg_database}" ALLOW_CONNECTIONS true')
    wait_mail(env, f"order-confirmed:{order_id}", "sent")
    assert len(provider_messages(s, to)) == 1
    # Not poison: nothing of this test went to the DLQ (only the poison test's records, key x).
    assert all(m.key() == b"x" for m in read_topic(s, s.topic_dlq, 0, timeout=2))


def test_cli_place_status_resend(env: Env) -> None:
    s = env.settings
    cli_env = {**os.environ, **settings_env(s)}

    def cli(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "flashsend.cli", *args],
            env=cli_env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    to = address("cli")
    placed = json.loads(cli("orders", "place", "--email", to, "--total", "12"))
    key = placed["dedupe_key"]
    wait_mail(env, key, "sent")
    assert f"{key}: sent" in cli("mail", "status", key)
    resent = json.loads(cli("mail", "resend", key))
    assert resent == {"dedupe_key": f"{key}:resend:1", "created": True}
    wait_mail(env, f"{key}:resend:1", "sent")
    assert len(provider_messages(s, to)) == 2
    shown = json.loads(cli("orders", "show", str(placed["order_id"])))
    assert shown["status"] == "confirmed"
