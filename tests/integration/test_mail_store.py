"""The mail state machine on real PostgreSQL 18: each test names the seed trap it covers and
would fail on the naive statement the seed shows (noted in each docstring)."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from flashsend.errors import UsageError
from flashsend.settings import Settings
from sinks.mail_enqueue import cancel_mail, enqueue_mail, mail_status, resend_mail
from sinks.mail_store import MailStore
from sinks.offsets import Assignment
from sinks.order_store import (
    MailEvent,
    NewOrder,
    apply_mail_event,
    cancel_order_monolith,
    monolith_key,
    place_order_monolith,
)
from sinks.queries import query
from sinks.recipient_store import PartitionSpan
from streams.rules.mail_logic import CancelMail, CancelResult, CreateMail, Delivery
from tests.conftest import LocalStack
from tests.integration.mail_fixtures import (
    lifecycle,
    mail_row,
    mail_settings,
    open_pool,
    run,
    store_for,
)


@pytest.fixture
def ms(stack: LocalStack) -> Settings:
    return mail_settings(stack)


def _enqueue(settings: Settings, key: str, **kw: Any) -> None:
    with psycopg.connect(settings.pg_dsn) as conn, conn.transaction():
        enqueue_mail(
            conn,
            key,
            kw.pop("to", "a@shop.flashsend.test"),
            "order_confirmation",
            {"order_id": 1},
            **kw,
        )


def _create(key: str, event_id: str | None = None) -> CreateMail:
    now = datetime.now(UTC)
    return CreateMail(
        event_id or str(uuid.uuid4()),
        key,
        key.split(":")[-1],
        "b@shop.flashsend.test",
        "order_confirmation",
        {},
        Delivery.AT_LEAST_ONCE,
        None,
        now,
    )


async def _ingest(store: MailStore, offset: int, *cmds: Any) -> Any:
    await store.offsets.take(Assignment.of(store.topic, [0]))
    return await store.ingest(
        [PartitionSpan(0, offset, offset + len(cmds) - 1)],
        {0: [(offset + i, cmd) for i, cmd in enumerate(cmds)]},
    )


# ---- architecture 1 (monolith) -----------------------------------------------------------


def test_order_rolled_back_means_no_mail(ms: Settings) -> None:
    """Trap: dispatch outside the order's transaction. enqueue_mail runs on the caller's
    connection: a rollback takes the mail with it; a commit keeps both and rings the bell."""
    from infra.migrate import apply_migrations
    from infra.orders_db import ORDERS_MIGRATIONS

    apply_migrations(ms.pg_dsn, ORDERS_MIGRATIONS)  # monolith: orders beside mail
    with pytest.raises(RuntimeError), psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
        order_id, _ = place_order_monolith(conn, NewOrder(email="r@shop.flashsend.test"))
        raise RuntimeError("payment failed after the mail was queued")
    assert mail_row(ms, monolith_key(order_id)) is None
    with psycopg.connect(ms.pg_dsn, autocommit=True) as listener:
        listener.execute("LISTEN mail_due")
        with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
            order_id, mail = place_order_monolith(conn, NewOrder(email="r@shop.flashsend.test"))
        bells = list(listener.notifies(timeout=2, stop_after=1))
    assert mail.created and bells, "the commit rings the doorbell"
    row = mail_row(ms, monolith_key(order_id))
    assert row is not None and row["status"] == "pending" and row["ref"] == f"shop:{order_id}"
    # Cancel trap 2: cancelling the order and its mail in one transaction, both or neither.
    with pytest.raises(RuntimeError), psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
        cancel_order_monolith(conn, order_id)
        raise RuntimeError("crash between the two")
    assert mail_row(ms, monolith_key(order_id))["status"] == "pending"  # type: ignore[index]
    with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
        assert cancel_order_monolith(conn, order_id) == [
            (monolith_key(order_id), CancelResult.CANCELLED)
        ]


def test_dedupe_key_is_the_intent(ms: Settings) -> None:
    """Layer 1 + trap 8: the same intent twice is one row; a second legitimate intent (a new
    reset token) is its own row."""
    _enqueue(ms, "password-reset:token-1")
    _enqueue(ms, "password-reset:token-1")
    _enqueue(ms, "password-reset:token-2")
    with psycopg.connect(ms.pg_dsn) as conn:
        rows = conn.execute("SELECT dedupe_key FROM mail ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["password-reset:token-1", "password-reset:token-2"]


# ---- architecture 2 consumer: event_id + dedupe_key + fenced offsets ----------------------


def test_redelivery_and_second_event_create_nothing(ms: Settings) -> None:
    """E1/E2/E3 of the seed: the same event twice, then another event id for the same intent;
    and the same offsets again (a zombie after a rebalance) is fenced, not re-applied."""

    async def scenario() -> None:
        pool = await open_pool(ms)
        try:
            store = store_for(ms, pool)
            first = _create("order-confirmed:42")
            out = await _ingest(store, 0, first)
            assert (out.created, out.fenced) == (1, 0)
            out = await _ingest(store, 1, first)  # relay published it again: new offset
            assert (out.created, out.duplicates) == (0, 1)
            out = await _ingest(store, 2, _create("order-confirmed:42"))  # another event id
            assert (out.created, out.duplicates) == (0, 1)
            out = await _ingest(store, 0, _create("order-confirmed:43"))  # zombie replay
            assert out.fenced == 1 and out.created == 0
        finally:
            await pool.close()

    run(scenario())
    assert mail_row(ms, "order-confirmed:43") is None


@pytest.mark.parametrize("first_commits", [True, False])
def test_two_consumers_one_message(ms: Settings, first_commits: bool) -> None:
    """Seed lab: consumer A inserts and holds its transaction; B inserts the same event 0.3 s
    later, waits on the unique index, and gets 0 rows if A commits, 1 row if A rolls back —
    no duplicate, and no loss. (A naive SELECT-then-INSERT inserts twice.)"""
    params = {
        "event_id": str(uuid.uuid4()),
        "dedupe_key": "order-confirmed:7",
        "ref": "7",
        "to_email": "c@shop.flashsend.test",
        "template": "order_confirmation",
        "data": "{}",
        "delivery": "at_least_once",
        "send_after": None,
        "occurred_at": None,
    }
    got: dict[str, Any] = {}

    def consumer_b() -> None:
        with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
            time.sleep(0.3)
            began = time.monotonic()
            got["rows"] = conn.execute(query("insert_mail"), params).fetchall()
            got["waited"] = time.monotonic() - began

    b = threading.Thread(target=consumer_b)
    with psycopg.connect(ms.pg_dsn) as conn:
        with conn.transaction(force_rollback=not first_commits):
            assert len(conn.execute(query("insert_mail"), params).fetchall()) == 1
            b.start()
            time.sleep(2.0)  # B is connected and waiting long before this ends
        b.join(10)
    assert got["waited"] > 0.5, "B waited for A on the unique index"
    assert len(got["rows"]) == (0 if first_commits else 1)
    with psycopg.connect(ms.pg_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM mail").fetchone() == (1,)


# ---- cancellation --------------------------------------------------------------------------


def _force_status(settings: Settings, key: str, status: str) -> None:
    with psycopg.connect(settings.pg_dsn) as conn:
        conn.execute(
            "UPDATE mail SET status = %s, attempts = 1 WHERE dedupe_key = %s", (status, key)
        )


def test_cancel_four_cases_in_one_statement(ms: Settings) -> None:
    """Seed: 50 pending, 51 sending, 52 sent, 53 no row yet. Naive `UPDATE … WHERE
    status='pending'` misses 53 (the late OrderConfirmed would then be mailed) and cannot tell
    52 "too late" from a redelivered cancel (cancel trap 3)."""
    for n in (50, 51, 52):
        _enqueue(ms, f"order-confirmed:{n}", ref=str(n))
    _force_status(ms, "order-confirmed:51", "sending")
    _force_status(ms, "order-confirmed:52", "sent")
    keys = [f"order-confirmed:{n}" for n in (50, 51, 52, 53)]
    with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
        results = dict(cancel_mail(conn, keys))
    assert results == {
        "order-confirmed:50": CancelResult.CANCELLED,
        "order-confirmed:51": CancelResult.IN_FLIGHT,
        "order-confirmed:52": CancelResult.TOO_LATE,
        "order-confirmed:53": CancelResult.TOMBSTONE,
    }
    assert mail_row(ms, "order-confirmed:51")["status"] == "sending"  # type: ignore[index]
    tomb = mail_row(ms, "order-confirmed:53")
    assert tomb and tomb["status"] == "cancelled" and tomb["event_id"] is None
    # Redelivered cancel: nothing, and above all no second EmailCancelTooLate.
    with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
        assert cancel_mail(conn, keys) == []
    assert lifecycle(ms, "order-confirmed:50") == ["EmailCancelled"]
    assert lifecycle(ms, "order-confirmed:51") == []
    assert lifecycle(ms, "order-confirmed:52") == ["EmailCancelTooLate"]
    assert lifecycle(ms, "order-confirmed:53") == ["EmailCancelled"]


def test_cancel_before_create_tombstone_swallows_it(ms: Settings) -> None:
    """Cancel trap 1 (and 2): OrderCancelled first leaves a tombstone with event_id NULL, so one
    cancel can tombstone several keys without a UNIQUE clash, and the late create is a no-op.
    Trap 4: the tombstone blocks that key for good; a new confirmation needs a new key."""

    async def scenario() -> None:
        pool = await open_pool(ms)
        try:
            store = store_for(ms, pool)
            cancel = CancelMail(str(uuid.uuid4()), "43", ["order-confirmed:43", "review:43"])
            out = await _ingest(store, 0, cancel)
            assert sorted(r for _, r in out.cancels) == [CancelResult.TOMBSTONE] * 2
            out = await _ingest(store, 2, _create("order-confirmed:43"))
            assert (out.created, out.duplicates) == (0, 1)
            out = await _ingest(store, 3, _create("order-confirmed:43:v2"))
            assert out.created == 1
        finally:
            await pool.close()

    run(scenario())
    assert mail_row(ms, "order-confirmed:43")["status"] == "cancelled"  # type: ignore[index]


def test_cancel_reaches_every_mail_of_the_order(ms: Settings) -> None:
    """Cancel trap 3 (architecture 1): not just the confirmation — a delayed review reminder of
    the same order is cancelled too (by ref), before its time, and never claimed."""
    later = datetime.now(UTC) + timedelta(hours=72)
    _enqueue(ms, "order-confirmed:60", ref="60")
    _enqueue(ms, "review-reminder:60", ref="60", send_after=later)

    async def claim() -> list[Any]:
        pool = await open_pool(ms)
        try:
            return await store_for(ms, pool).claim(10, 30)
        finally:
            await pool.close()

    with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
        results = dict(cancel_mail(conn, ["order-confirmed:60"], ref="60"))
    assert results == {
        "order-confirmed:60": CancelResult.CANCELLED,
        "review-reminder:60": CancelResult.CANCELLED,
    }
    assert run(claim()) == []


def test_cancel_race_three_orders(ms: Settings) -> None:
    """Seed C1/C2/C3 with the real statements and two sessions, one holding its transaction.
    C2 is the point: the cancel loses to a claim in progress and must NOT turn the row
    `cancelled` (cancel trap 1: the mail goes, the DB would lie)."""
    for n in (42, 43, 44):
        _enqueue(ms, f"order-confirmed:{n}", ref=str(n))
    claim_sql = query("claim_due_mail").replace(
        "WHERE ((status", "WHERE dedupe_key = %(key)s AND ((status"
    )

    holding = threading.Event()  # set once the holder's statement ran: its lock is taken

    def claim(key: str, hold: float = 0.0) -> list[Any]:
        with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
            params = {"limit": 1, "lease_s": 30, "key": key, "exempt": []}
            rows = conn.execute(claim_sql, params).fetchall()
            holding.set()
            time.sleep(hold)
            return rows

    def cancel(key: str, hold: float = 0.0) -> list[Any]:
        with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
            out = cancel_mail(conn, [key])
            holding.set()
            time.sleep(hold)
            return out

    # C1: cancel first, then the claim finds nothing.
    assert cancel("order-confirmed:42") == [("order-confirmed:42", CancelResult.CANCELLED)]
    assert claim("order-confirmed:42") == []
    # C2: claim holds its transaction; the cancel waits, then sees `sending`.
    holding.clear()
    t = threading.Thread(target=claim, args=("order-confirmed:43", 1.0))
    t.start()
    assert holding.wait(10)
    assert cancel("order-confirmed:43") == [("order-confirmed:43", CancelResult.IN_FLIGHT)]
    t.join()
    # C3: cancel holds its transaction; the claim waits, then finds nothing.
    holding.clear()
    t = threading.Thread(target=cancel, args=("order-confirmed:44", 1.0))
    t.start()
    assert holding.wait(10)
    assert claim("order-confirmed:44") == []
    t.join()
    statuses = {n: mail_row(ms, f"order-confirmed:{n}")["status"] for n in (42, 43, 44)}  # type: ignore[index]
    assert statuses == {42: "cancelled", 43: "sending", 44: "cancelled"}


# ---- sender transitions: fencing token, lease, failure branch -----------------------------


def test_failure_branch_reads_the_cancel_flag(ms: Settings) -> None:
    """Seed: a send fails after the cancel arrived; the naive failure branch puts the row back
    to pending (the retry would mail a cancelled order). Ours reads the flag: cancelled."""
    _enqueue(ms, "order-confirmed:44", ref="44")

    async def scenario() -> Any:
        pool = await open_pool(ms)
        try:
            store = store_for(ms, pool)
            (mail,) = await store.claim(1, 30)
            with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
                cancel_mail(conn, ["order-confirmed:44"])
            return await store.transition(
                "mark_mail_retry",
                {
                    "id": mail.id,
                    "token": mail.token,
                    "retry_at": datetime.now(UTC),
                    "count_error": 1,
                    "error": "ConnectError",
                },
                "ConnectError",
            )
        finally:
            await pool.close()

    done = run(scenario())
    assert done.status == "cancelled"
    assert lifecycle(ms, "order-confirmed:44") == ["EmailCancelled"]


def test_fencing_token_keeps_state_right_after_lease_expiry(ms: Settings) -> None:
    """Layer 3: worker 1's lease runs out, worker 3 re-claims (attempts 2); worker 1's late
    `sent` with token 1 updates nothing, worker 3's with token 2 wins. Without the token
    (`WHERE id = …`) worker 1 would overwrite the provider id."""
    _enqueue(ms, "order-confirmed:45")

    async def scenario() -> tuple[Any, Any]:
        pool = await open_pool(ms)
        try:
            store = store_for(ms, pool)
            (w1,) = await store.claim(1, 0.2)
            await _sleep(0.4)
            (w3,) = await store.claim(1, 30)
            assert (w1.token, w3.token) == (1, 2)
            late = await store.transition(
                "mark_mail_sent", {"id": w1.id, "token": w1.token, "message_id": "w1"}, None
            )
            won = await store.transition(
                "mark_mail_sent", {"id": w3.id, "token": w3.token, "message_id": "w3"}, None
            )
            return late, won
        finally:
            await pool.close()

    late, won = run(scenario())
    assert late is None and won.status == "sent"
    row = mail_row(ms, "order-confirmed:45")
    assert row and (row["provider_id"], row["attempts"]) == ("w3", 2)
    assert lifecycle(ms, "order-confirmed:45") == ["EmailSent"]


def test_dead_worker_never_leaves_mail_stuck(ms: Settings) -> None:
    """Architecture-1 trap 2: a worker SIGKILLed mid-send leaves `sending`. Nothing stays
    there: an at-least-once row is re-claimed after its lease, an at-most-once row becomes
    `unknown` (never resent blindly); a late answer for the same attempt still resolves it."""
    _enqueue(ms, "otp:1")
    _enqueue(ms, "payment:1", delivery=Delivery.AT_MOST_ONCE)

    async def scenario() -> tuple[list[Any], list[Any], Any]:
        pool = await open_pool(ms)
        try:
            store = store_for(ms, pool)
            claimed = await store.claim(10, 0.2)  # the worker then "dies"
            await _sleep(0.4)
            expired = await store.expire_leases()
            again = await store.claim(10, 30)
            late = next(m for m in claimed if m.dedupe_key == "payment:1")
            resolved = await store.transition(
                "mark_mail_sent", {"id": late.id, "token": late.token, "message_id": "x"}, None
            )
            return expired, again, resolved
        finally:
            await pool.close()

    expired, again, resolved = run(scenario())
    assert [m.dedupe_key for m in expired] == ["payment:1"]
    assert [m.dedupe_key for m in again] == ["otp:1"]
    assert resolved.status == "sent"
    assert lifecycle(ms, "payment:1") == ["EmailFailed", "EmailSent"]


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)


# ---- support, retention, the order service's view ----------------------------------------


def test_status_and_safe_resend(ms: Settings) -> None:
    """Support's button: a new key, one row even if two agents click at once; refused while
    the original may still go."""
    _enqueue(ms, "order-confirmed:70", ref="70")
    with psycopg.connect(ms.pg_dsn) as conn, pytest.raises(UsageError, match="still pending"):
        resend_mail(conn, "order-confirmed:70")
    _force_status(ms, "order-confirmed:70", "unknown")
    results: list[Any] = []

    def click() -> None:
        with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
            results.append(resend_mail(conn, "order-confirmed:70"))

    threads = [threading.Thread(target=click) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.created for r in results) == [False, True]
    with psycopg.connect(ms.pg_dsn) as conn:
        status = mail_status(conn, "order-confirmed:70")
    assert status["status"] == "unknown"
    assert [r["dedupe_key"] for r in status["related"]] == ["order-confirmed:70:resend:1"]


def test_purge_keeps_keys_for_the_topic_retention(ms: Settings) -> None:
    """Architecture-2 trap 4 / cancel trap 5: purging dedupe keys (tombstones included)
    sooner than the broker's retention lets a replay mail old orders again."""
    from streams.rules.mail_logic import ConfigError, purge_horizon

    with pytest.raises(ConfigError):
        purge_horizon(
            time.time(), retention_s=3 * 86400, topic_retention_s=7 * 86400, max_event_age_s=86400
        )
    horizon = purge_horizon(
        time.time(), retention_s=8 * 86400, topic_retention_s=7 * 86400, max_event_age_s=86400
    )
    _enqueue(ms, "old:1")
    _enqueue(ms, "old:2")
    _enqueue(ms, "young:1")
    with psycopg.connect(ms.pg_dsn) as conn:
        conn.execute(
            "UPDATE mail SET status = 'sent', created_at = now() - interval '9 days' "
            "WHERE dedupe_key = 'old:1'"
        )
        conn.execute(
            "UPDATE mail SET created_at = now() - interval '9 days' WHERE dedupe_key = 'old:2'"
        )  # still pending: never purged

    async def purge() -> int:
        pool = await open_pool(ms)
        try:
            return await store_for(ms, pool).purge(datetime.fromtimestamp(horizon, tz=UTC))
        finally:
            await pool.close()

    assert run(purge()) == 1
    assert mail_row(ms, "old:1") is None and mail_row(ms, "old:2") and mail_row(ms, "young:1")


def test_order_service_ignores_out_of_order_events(ms: Settings) -> None:
    """The feedback direction is at-least-once and unordered: a stale EmailFailed after a
    newer EmailSent, or a redelivery, changes nothing; TooLate sets only the cancel outcome."""
    now = datetime.now(UTC)

    def ev(kind: str, status: str, at: datetime, msg: str | None = None) -> MailEvent:
        return MailEvent(str(uuid.uuid4()), kind, at, "order-confirmed:9", "9", status, msg, None)

    with psycopg.connect(ms.orders_pg_dsn) as conn:
        conn.execute("INSERT INTO orders (id, email) VALUES (9, 'x@shop.flashsend.test')")
        assert apply_mail_event(conn, ev("EmailCancelTooLate", "sent", now + timedelta(seconds=3)))
        assert apply_mail_event(conn, ev("EmailSent", "sent", now + timedelta(seconds=2), "m1"))
        assert not apply_mail_event(conn, ev("EmailFailed", "failed", now + timedelta(seconds=1)))
        assert not apply_mail_event(conn, ev("EmailSent", "sent", now + timedelta(seconds=2)))
        row = conn.execute("SELECT status, message_id, cancel_outcome FROM order_emails").fetchone()
    assert row == ("sent", "m1", "too_late")
