"""The order service's outbox relay on the real broker and PostgreSQL."""

from __future__ import annotations

import logging
import threading
import time
from decimal import Decimal
from typing import Any

import psycopg
import pytest

from flashsend.settings import Settings
from producers.mail_topics import ensure_mail_topics
from sinks.order_store import NewOrder, place_order
from tests.conftest import LocalStack
from tests.integration.mail_fixtures import (
    mail_settings,
    order_codec,
    order_relay,
    read_topic,
)


@pytest.fixture
def ms(stack: LocalStack) -> Settings:
    settings = mail_settings(stack)
    ensure_mail_topics(settings)
    return settings


def place(settings: Settings, n: int, **kw: Any) -> list[int]:
    ids = []
    with psycopg.connect(settings.orders_pg_dsn) as conn:
        for i in range(n):
            with conn.transaction():
                order = NewOrder(
                    email=f"o{i}@shop.flashsend.test",
                    total=Decimal("10.50"),
                    items=[{"sku": "A1", "name": "Áo", "quantity": 1, "price": "10.50"}],
                    **kw,
                )
                ids.append(place_order(conn, order, topic=settings.topic_order_events).order_id)
    return ids


def test_publishes_in_id_order_keyed_by_order_with_the_rows_event_id(ms: Settings) -> None:
    ids = place(ms, 5)
    relay = order_relay(ms)
    try:
        assert relay.acquire()
        assert relay.run_once().published == 5
        assert relay.run_once().published == 0
    finally:
        relay.close()
    with psycopg.connect(ms.orders_pg_dsn) as conn:
        rows = conn.execute(
            "SELECT event_id::text, published_at IS NOT NULL FROM outbox ORDER BY id"
        ).fetchall()
    msgs = read_topic(ms, ms.topic_order_events, 5)
    codec = order_codec(ms)
    by_key = {int(m.key()): codec.decode(m.value()) for m in msgs}
    assert sorted(by_key) == ids and all(published for _, published in rows)
    assert [by_key[i]["event_id"] for i in ids] == [r[0] for r in rows]
    first = by_key[ids[0]]
    assert (first["event_type"], first["version"], first["dedupe_key"]) == (
        "OrderConfirmed",
        1,
        f"order-confirmed:{ids[0]}",
    )
    assert first["items"][0]["name"] == "Áo" and first["email"] == "o0@shop.flashsend.test"


def test_exactly_one_relay_holds_the_lock(ms: Settings) -> None:
    """Trap 7: two relays would publish two ranges concurrently and reorder an order's
    events. The advisory lock admits one; it is released with the session (trap 9's point:
    the lock is the SESSION's — when the leader's session goes, so does its leadership, and
    the old leader notices instead of publishing on without the lock)."""
    from producers.outbox_relay import NotLeader

    first, second = order_relay(ms), order_relay(ms)
    try:
        assert first.acquire()
        assert not second.acquire()
        first.close()
        assert second.acquire()
        with psycopg.connect(ms.orders_pg_dsn, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks "
                "WHERE locktype = 'advisory' AND granted AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        # The lock dies with the leader's session, once its backend has exited:
        # pg_terminate_backend only signals it.
        deadline = time.monotonic() + 10.0
        while not first.acquire():
            assert time.monotonic() < deadline, "the terminated session kept its lock"
            time.sleep(0.05)
        with pytest.raises((NotLeader, psycopg.Error)):
            second.run_once()
        assert not second.acquire()
    finally:
        first.close()
        second.close()


def test_failing_row_backs_off_dies_with_an_alert_and_order_is_kept(
    ms: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """Trap 8: no transaction around the batch — rows before the failure stay published, the
    failing row is retried (never the ones before it), then marked dead with an ALERT after N
    message-specific failures so later events flow again, still in id order."""
    place(ms, 2)
    place(ms, 1, customer_name="x" * 2_000_000)  # larger than the broker accepts
    place(ms, 2)
    relay = order_relay(ms, max_failures=2)
    try:
        assert relay.acquire()
        first = relay.run_once()
        assert (first.published, first.transient, first.dead) == (2, False, False)
        with caplog.at_level(logging.ERROR, logger="flashsend.relay"):
            second = relay.run_once()
        assert (second.published, second.dead) == (0, True)
        assert any("ALERT outbox row dead" in r.message for r in caplog.records)
        assert relay.run_once().published == 2
    finally:
        relay.close()
    keys = [int(m.key()) for m in read_topic(ms, ms.topic_order_events, 4)]
    with psycopg.connect(ms.orders_pg_dsn) as conn:
        dead = conn.execute(
            "SELECT order_id, attempts FROM (SELECT (payload->>'order_id')::int "
            "AS order_id, attempts, dead_at FROM outbox) o "
            "WHERE dead_at IS NOT NULL"
        ).fetchall()
    assert dead == [(3, 2)]
    assert sorted(keys) == [1, 2, 4, 5] and keys.index(1) < keys.index(2)


def test_relay_loop_backs_off_while_the_broker_is_down(ms: Settings, stack: LocalStack) -> None:
    """The broker is unreachable: orders still commit in milliseconds (the write path never
    touches Kafka), the relay backs off without spending the rows' failure budget, and
    publishes everything once a broker answers."""
    from infra.process import free_port

    down = mail_settings(
        stack, kafka_bootstrap=f"127.0.0.1:{free_port()}", orders_pg_dsn=ms.orders_pg_dsn
    )
    place(ms, 3)  # three commits with no broker: the write path never calls Kafka
    relay = order_relay(down, publish_timeout_s=1.0, backoff_base_s=0.1, backoff_cap_s=0.3)
    stop = threading.Event()
    passes: list[object] = []
    thread = threading.Thread(target=relay.run, args=(stop,), kwargs={"on_pass": passes.append})
    thread.start()
    deadline = time.monotonic() + 20
    while len(passes) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    stop.set()
    thread.join(15)
    assert len(passes) >= 2 and relay.stats.published == 0
    with psycopg.connect(ms.orders_pg_dsn) as conn:
        rows = conn.execute(
            "SELECT attempts, dead_at, last_error FROM outbox ORDER BY id"
        ).fetchall()
    assert all(a == 0 and d is None for a, d, _ in rows) and rows[0][2]
    up = order_relay(ms)
    try:
        assert up.acquire() and up.run_once().published == 3
    finally:
        up.close()
