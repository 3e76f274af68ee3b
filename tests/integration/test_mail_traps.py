"""Seed traps that only show up under a particular interleaving, reproduced for real: a
transaction that commits after a higher id (architecture 1), an order deleted under its mail
(architecture 1), a broker ack that arrives too late (architecture 2), and addresses that
bounced or complained (transactional mail and the suppression list).

Every test runs our real code against the real services (PostgreSQL 18, the Kafka broker, the
SES stand-in over HTTP) and says in its docstring what the naive version does and why the test
catches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from flashsend.settings import Settings
from infra.migrate import apply_migrations
from infra.orders_db import ORDERS_MIGRATIONS
from producers.mail_topics import ensure_mail_topics
from sinks.mail_enqueue import cancel_mail, enqueue_mail, resend_mail
from sinks.order_store import NewOrder, monolith_key, place_order, place_order_monolith
from sinks.ses import SesSender, make_client
from streams.mail_app import sender_config
from streams.mail_sender import MailSender
from streams.rules.mail_logic import CancelResult
from tests.conftest import LocalStack
from tests.integration.mail_fixtures import (
    address,
    lifecycle,
    mail_row,
    mail_settings,
    open_pool,
    order_codec,
    order_relay,
    provider_messages,
    put_templates,
    read_topic,
    start_mail_worker,
    stop_process,
    store_for,
    wait_for,
)

T = TypeVar("T")
DATA = {"order_id": 1, "customer_name": "Lan", "total": "1", "currency": "VND"}


@pytest.fixture
def ms(stack: LocalStack) -> Settings:
    settings = mail_settings(stack, mail_ses_timeout_s=3.0)
    put_templates(settings)
    return settings


def status(settings: Settings, key: str) -> str | None:
    row = mail_row(settings, key)
    return None if row is None else str(row["status"])


def with_sender(
    settings: Settings, scenario: Callable[[], T], *, listen: bool = True
) -> tuple[T, MailSender]:
    """Run one real MailSender (its claim loop and its sweeper) while the blocking `scenario`
    runs in a thread; stop it when the scenario returns. listen=False: no doorbell at all, so
    only the sweeper (every mail_poll_s) can find a row."""

    async def main() -> tuple[T, MailSender]:
        pool = await open_pool(settings, size=6)
        try:
            ses = SesSender(make_client(settings, timeout=settings.mail_ses_timeout_s))
            sender = MailSender(
                config=sender_config(settings),
                store=store_for(settings, pool),
                ses=ses,
                listen_dsn=settings.pg_dsn if listen else None,
            )
            sender.start()
            try:
                result = await asyncio.to_thread(scenario)
            finally:
                await sender.stop(grace_s=5)
            return result, sender
        finally:
            await pool.close()

    return asyncio.run(main())


def outbox_events(settings: Settings, dedupe_key: str) -> list[tuple[str, dict[str, Any]]]:
    with psycopg.connect(settings.pg_dsn) as conn:
        rows = conn.execute(
            "SELECT event_type, payload FROM mail_outbox WHERE dedupe_key = %s ORDER BY id",
            (dedupe_key,),
        ).fetchall()
    return [(str(t), p if isinstance(p, dict) else json.loads(p)) for t, p in rows]


# ---- architecture 1, trap 10: sequences are not commit order ------------------------------


def test_row_committed_after_a_higher_id_is_still_sent_once(ms: Settings) -> None:
    """Architecture-1 trap 10 (sequence gaps), the dangerous half. Transaction A enqueues
    first and gets the LOWER id, but stays open; B enqueues later (higher id) and commits; a
    duplicate enqueue of B burns another id (ids are not dense either). The sender runs with
    NO doorbell, so only its sweeper can find rows: it sends B while A is invisible. Then A
    commits, with the same sender still running: A must be sent, exactly once.

    Naive version: a poller that keeps a high-water mark and claims `WHERE id > last_seen`
    (or a relay/consumer reading the table by id) moves past B's id while A is uncommitted and
    never looks below it again: A's confirmation is lost silently, and this test times out
    waiting for it. Ours claims by state (`status = 'pending'`, partial index mail_todo), never
    by position, so A is claimed on the first sweep after it becomes visible."""
    to_a, to_b = address("gap-a"), address("gap-b")
    conn_a = psycopg.connect(ms.pg_dsn)
    try:
        a = enqueue_mail(conn_a, "gap:a", to_a, "order_confirmation", DATA)  # tx A: open
        with psycopg.connect(ms.pg_dsn) as conn_b, conn_b.transaction():
            b = enqueue_mail(conn_b, "gap:b", to_b, "order_confirmation", DATA)
        with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
            again = enqueue_mail(conn, "gap:b", to_b, "order_confirmation", DATA)
        assert a.id is not None and b.id is not None and a.id < b.id
        assert not again.created  # ON CONFLICT burnt a sequence value: harmless, not counted

        def scenario() -> None:
            wait_for("B sent", lambda: status(ms, "gap:b") == "sent")
            time.sleep(3 * ms.mail_poll_s)  # the sweeper passes again over B, the highest id
            assert status(ms, "gap:a") is None  # A is invisible: not committed yet
            conn_a.commit()
            wait_for("A sent", lambda: status(ms, "gap:a") == "sent", timeout=20)

        _, sender = with_sender(ms, scenario, listen=False)
    finally:
        conn_a.close()
    assert len(provider_messages(ms, to_a)) == 1 and len(provider_messages(ms, to_b)) == 1
    row_a = mail_row(ms, "gap:a")
    assert row_a and row_a["id"] == a.id and row_a["attempts"] == 1
    assert lifecycle(ms, "gap:a") == ["EmailSent"] and sender.stats.sent == 2


# ---- architecture 1, cancel trap 5: the order is hard-deleted ------------------------------


def test_hard_deleted_order_never_breaks_the_sender(ms: Settings) -> None:
    """Architecture-1 cancel trap 5: the order row is DELETEd instead of cancelled, after its
    confirmation was queued (monolith: orders live beside `mail`). Documented behaviour
    (docs/transactional.md §5, A1-5): the mail row carries everything it needs (fat), nothing
    dereferences the order at send time, and "no order" means "no mail" only when the deleting
    code says so in the same transaction (cancel_mail by ref).
    - deleted together with cancel_mail(ref=…) in one transaction → `cancelled`, EmailCancelled,
      nothing reaches SES;
    - that delete + cancel rolled back → both stay, and the mail goes (both or neither);
    - deleted by plain SQL (an admin tool that forgot the mail) → the mail still goes, once,
      rendered from the row's own data (the order no longer exists anywhere).

    Naive version (the seed's Laravel job with SerializesModels): the job re-loads the order
    when it runs, gets ModelNotFoundException and lands in failed_jobs; here that would be a
    sender that reads `orders` at send time — the admin-deleted mail would end `failed` (or
    retry forever) instead of `sent`, with no SES message, and this test fails."""
    apply_migrations(ms.pg_dsn, ORDERS_MIGRATIONS)  # monolith: orders beside mail
    to_cancelled, to_kept, to_orphan = address("del-c"), address("del-k"), address("del-o")
    ids: dict[str, int] = {}
    for name, to in (("cancelled", to_cancelled), ("kept", to_kept), ("orphan", to_orphan)):
        order = NewOrder(email=to, customer_name="Lan", total=Decimal("1250000"))
        with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
            ids[name], mail = place_order_monolith(conn, order)
        assert mail.created

    def delete_with_its_mail(order_id: int) -> list[tuple[str, CancelResult]]:
        with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
            assert conn.execute("DELETE FROM orders WHERE id = %s", (order_id,)).rowcount == 1
            return cancel_mail(conn, [monolith_key(order_id)], ref=f"shop:{order_id}")

    assert delete_with_its_mail(ids["cancelled"]) == [
        (monolith_key(ids["cancelled"]), CancelResult.CANCELLED)
    ]
    with pytest.raises(RuntimeError), psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
        conn.execute("DELETE FROM orders WHERE id = %s", (ids["kept"],))
        cancel_mail(conn, [monolith_key(ids["kept"])], ref=f"shop:{ids['kept']}")
        raise RuntimeError("crash before commit")
    with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():  # the admin tool
        assert conn.execute("DELETE FROM orders WHERE id = %s", (ids["orphan"],)).rowcount == 1

    kept, orphan = monolith_key(ids["kept"]), monolith_key(ids["orphan"])
    with_sender(
        ms, lambda: wait_for("sent", lambda: status(ms, kept) == status(ms, orphan) == "sent")
    )
    with psycopg.connect(ms.pg_dsn) as conn:
        left = [r[0] for r in conn.execute("SELECT id FROM orders ORDER BY id").fetchall()]
    assert left == [ids["kept"]]  # the rollback kept the order, the other two are gone
    assert status(ms, monolith_key(ids["cancelled"])) == "cancelled"
    assert provider_messages(ms, to_cancelled) == []
    assert lifecycle(ms, monolith_key(ids["cancelled"])) == ["EmailCancelled"]
    assert len(provider_messages(ms, to_kept)) == 1
    (msg,) = provider_messages(ms, to_orphan)
    assert msg["subject"] == f"Order {ids['orphan']} confirmed"  # from the row, not `orders`
    assert msg["rendering_failure"] is None  # every variable of the template was in the row
    assert lifecycle(ms, orphan) == ["EmailSent"]


# ---- architecture 2, trap 10: the broker's ack arrives too late ----------------------------


def wait_consumed(settings: Settings, timeout: float = 60.0) -> None:
    """Until the mail service's stored offsets reach the end of every order.events partition."""
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": "watermarks"})
    try:

        def done() -> bool:
            high = sum(
                consumer.get_watermark_offsets(
                    TopicPartition(settings.topic_order_events, p), timeout=5
                )[1]
                for p in range(settings.order_events_partitions)
            )
            with psycopg.connect(settings.pg_dsn) as conn:
                row = conn.execute(
                    "SELECT coalesce(sum(next_offset), 0) FROM kafka_offsets WHERE group_id = %s",
                    (settings.group_mail,),
                ).fetchone()
            return row is not None and int(row[0]) >= high

        wait_for("order.events consumed", done, timeout)
    finally:
        consumer.close()


def _wait_stopped(pid: int, timeout: float = 5.0) -> None:
    """Until every thread of `pid` is stopped: a JVM thread already sending its ack when
    SIGSTOP arrives would otherwise still answer."""
    deadline = time.monotonic() + timeout
    task = Path(f"/proc/{pid}/task")
    while True:
        states = []
        for t in task.iterdir():
            with contextlib.suppress(OSError):
                states.append((t / "stat").read_text().rsplit(")", 1)[1].split()[0])
        if states and all(st in ("T", "t") for st in states):
            return
        assert time.monotonic() < deadline, f"process {pid} not stopped: {states}"
        time.sleep(0.01)


def test_ack_timeout_publishes_twice_and_the_mail_service_sends_once(
    stack: LocalStack, tmp_path: Path
) -> None:
    """Architecture-2 trap 10 for real: the relay publishes an order event, the broker stops
    answering (SIGSTOP) before it acks, the relay's delivery timeout (1 s here; 30 s by
    default) expires and the row stays unpublished with a transient error (its failure budget
    untouched). The broker resumes and appends the request it had already received; the relay
    retries and the broker appends the event again. Two records, two offsets, one event_id.
    A real `flashsend worker --role mail` then consumes both.

    Naive version: a mail service that trusts the broker to deliver each event once (a mail
    per record), or deduplicates by Kafka offset (the copies have different offsets, trap 3),
    creates two rows and the customer gets two confirmations — this test counts one row and one
    SES message. A relay that generated event_id at publish time (trap 2) would give the copies
    two ids, which the first assertion on the topic catches."""
    if not stack.owned:
        pytest.skip("pauses the broker: only the test session's own broker")
    ms = mail_settings(stack)
    put_templates(ms)
    ensure_mail_topics(ms)

    def place() -> tuple[int, str]:
        to = address("ack")
        with psycopg.connect(ms.orders_pg_dsn) as conn, conn.transaction():
            placed = place_order(
                conn, NewOrder(email=to, total=Decimal("99")), topic=ms.topic_order_events
            )
        return placed.order_id, to

    broker_pid = stack.kafka.process.pid()
    assert broker_pid is not None
    relay = order_relay(ms, publish_timeout_s=1.0)
    try:
        place()
        assert relay.acquire() and relay.run_once().published == 1  # connected, metadata known
        order_id, to = place()
        os.kill(broker_pid, signal.SIGSTOP)
        try:
            _wait_stopped(broker_pid)  # the signal is delivered asynchronously
            timed_out = relay.run_once()
        finally:
            os.kill(broker_pid, signal.SIGCONT)
        assert (timed_out.published, timed_out.transient) == (0, True)
        with psycopg.connect(ms.orders_pg_dsn) as conn:
            published, attempts, error = conn.execute(
                "SELECT published_at, attempts, last_error FROM outbox "
                "WHERE payload->>'order_id' = %s",
                (str(order_id),),
            ).fetchone() or (None, None, None)
        assert published is None and attempts == 0 and "timed out" in str(error).lower()
        wait_for("the relay's retry is acked", lambda: relay.run_once().published == 1)
    finally:
        relay.close()

    codec = order_codec(ms)
    copies = [
        (m.offset(), codec.decode(m.value())["event_id"])
        for m in read_topic(ms, ms.topic_order_events, 3, timeout=15)
        if int(m.key()) == order_id
    ]
    assert len(copies) == 2, f"the broker should hold the event twice: {copies}"
    assert copies[0][1] == copies[1][1] and copies[0][0] != copies[1][0]

    worker = start_mail_worker(ms, tmp_path)
    try:
        key = f"order-confirmed:{order_id}"
        wait_for(f"{key} sent", lambda: worker.poll() is None and status(ms, key) == "sent", 90)
        wait_consumed(ms)  # both copies went through the ingest
        assert worker.poll() is None
    finally:
        stop_process(worker)
    with psycopg.connect(ms.pg_dsn) as conn:
        rows = conn.execute(
            "SELECT event_id::text, attempts FROM mail WHERE ref = %s", (str(order_id),)
        ).fetchall()
    assert rows == [(copies[0][1], 1)]
    assert len(provider_messages(ms, to)) == 1
    assert lifecycle(ms, key) == ["EmailSent"]


# ---- transactional mail and the suppression list -----------------------------------------


def test_suppressed_addresses_get_no_transactional_mail(ms: Settings) -> None:
    """A hard bounce, a complaint or a manual block stops transactional mail too; a
    marketing-only reason ('unsubscribe') does not: an order confirmation still goes to
    someone who opted out of newsletters. Checked at the claim (a suppression arriving after
    the enqueue — here all of them — still counts), by normalised address (the rows are in
    mixed case, the suppressions lower case, as the feedback agent writes them). A blocked row
    ends `suppressed` with last_error 'suppressed:<reason>' and an EmailFailed (mail_status
    'suppressed') carrying that reason, with no SES call; a row whose lease expired (an earlier
    call may have delivered it) ends `unknown` instead.

    Naive version (the claim before this change): nothing looks at email_suppressions, SES is
    called for every row, and this test finds messages for the blocked addresses."""
    tags = ("bounce", "complaint", "manual", "unsubscribe", "clean", "expired")
    to = {t: address(f"Supp-{t}").replace("shop.flashsend", "Shop.Flashsend") for t in tags}
    with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
        enqueue_mail(conn, "supp:expired", to["expired"], "order_confirmation", DATA)

    async def claim_and_die() -> None:  # a worker claims it with a short lease, then dies
        pool = await open_pool(ms)
        try:
            (mail,) = await store_for(ms, pool).claim(1, 0.2)
            assert mail.dedupe_key == "supp:expired"
        finally:
            await pool.close()

    asyncio.run(claim_and_die())
    for t in tags[:-1]:
        with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
            enqueue_mail(conn, f"supp:{t}", to[t], "order_confirmation", DATA)
    reasons = {"bounce": "bounce", "complaint": "complaint", "manual": "manual"}
    reasons |= {"unsubscribe": "unsubscribe", "expired": "complaint"}
    with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
        for t, reason in reasons.items():
            conn.execute(
                "INSERT INTO email_suppressions (email, reason, source_event) VALUES (%s, %s, %s)",
                (to[t].lower(), reason, "test"),
            )
    done = ("sent", "suppressed", "unknown")
    _, sender = with_sender(
        ms,
        lambda: wait_for("all ended", lambda: all(status(ms, f"supp:{t}") in done for t in tags)),
    )
    sent = {t: len(provider_messages(ms, to[t])) for t in tags}
    assert sent == {
        "bounce": 0,
        "complaint": 0,
        "manual": 0,
        "unsubscribe": 1,
        "clean": 1,
        "expired": 0,  # the dead worker never called SES here; the stand-in is the witness
    }
    for t, want in (
        ("bounce", "suppressed"),
        ("complaint", "suppressed"),
        ("manual", "suppressed"),
    ):
        row = mail_row(ms, f"supp:{t}")
        assert row and (row["status"], row["last_error"], row["attempts"]) == (
            want,
            f"suppressed:{t}",
            0,
        )
        ((event, payload),) = outbox_events(ms, f"supp:{t}")
        assert (event, payload["mail_status"], payload["reason"]) == (
            "EmailFailed",
            "suppressed",
            f"suppressed:{t}",
        )
    row = mail_row(ms, "supp:expired")
    assert row and (row["status"], row["last_error"], row["attempts"]) == (
        "unknown",
        "suppressed:complaint",
        1,
    )
    assert [(e, p["mail_status"]) for e, p in outbox_events(ms, "supp:expired")] == [
        ("EmailFailed", "unknown")
    ]
    assert status(ms, "supp:unsubscribe") == status(ms, "supp:clean") == "sent"
    assert (sender.stats.suppressed, sender.stats.sent) == (4, 2)


def test_support_resend_to_a_suppressed_address_is_blocked_too(ms: Settings) -> None:
    """Support's resend creates a new row (new key); it is claimed like any other, so it is
    blocked as long as the address is suppressed — the suppression is removed on purpose (the
    customer fixed their mailbox), never bypassed by a button. Naive version: a resend path
    that calls SES directly (or marks the row so the claim skips the check) mails a bounced
    address again, and the stand-in would count two messages here."""
    to = address("resend").upper().replace("SHOP", "shop")
    with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
        enqueue_mail(conn, "supp-resend:1", to, "order_confirmation", DATA)
        conn.execute(
            "INSERT INTO email_suppressions (email, reason) VALUES (lower(%s), 'bounce')", (to,)
        )
    with_sender(ms, lambda: wait_for("ended", lambda: status(ms, "supp-resend:1") == "suppressed"))
    with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
        again = resend_mail(conn, "supp-resend:1")
    with_sender(ms, lambda: wait_for("ended", lambda: status(ms, again.dedupe_key) == "suppressed"))
    with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
        conn.execute("DELETE FROM email_suppressions WHERE email = lower(%s)", (to,))
        third = resend_mail(conn, "supp-resend:1")
    with_sender(ms, lambda: wait_for("sent", lambda: status(ms, third.dedupe_key) == "sent"))
    assert len(provider_messages(ms, to)) == 1


def test_legally_required_templates_ignore_bounce_and_complaint_but_not_a_manual_block(
    stack: LocalStack,
) -> None:
    """FLASHSEND_MAIL_SUPPRESSION_EXEMPT_TEMPLATES: mail the law requires (here the
    confirmation template stands for it) still goes to a hard-bounced or complaining address;
    an operator's manual block still stops it, and any other template is still blocked.
    Naive version: one rule for every template (the exempt mail is `suppressed`, or nothing is)."""
    ms = mail_settings(stack, mail_suppression_exempt_templates=("order_confirmation",))
    put_templates(ms)
    cases = {  # key: (template, suppression reason)
        "legal-bounce": ("order_confirmation", "bounce"),
        "legal-complaint": ("order_confirmation", "complaint"),
        "legal-manual": ("order_confirmation", "manual"),
        "other-bounce": ("receipt_not_in_ses", "bounce"),
    }
    to = {key: address(key) for key in cases}
    with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
        for key, (template, reason) in cases.items():
            enqueue_mail(conn, f"exempt:{key}", to[key], template, DATA)
            conn.execute(
                "INSERT INTO email_suppressions (email, reason) VALUES (lower(%s), %s)",
                (to[key], reason),
            )
    ended = ("sent", "suppressed", "failed", "unknown")
    with_sender(
        ms,
        lambda: wait_for(
            "all ended", lambda: all(status(ms, f"exempt:{k}") in ended for k in cases)
        ),
    )
    assert {k: status(ms, f"exempt:{k}") for k in cases} == {
        "legal-bounce": "sent",
        "legal-complaint": "sent",
        "legal-manual": "suppressed",
        "other-bounce": "suppressed",
    }
    assert {k: len(provider_messages(ms, to[k])) for k in cases} == {
        "legal-bounce": 1,
        "legal-complaint": 1,
        "legal-manual": 0,
        "other-bounce": 0,
    }


def test_an_invalid_address_ends_failed_without_a_call_and_the_rest_go(ms: Settings) -> None:
    """Transactional mail runs the same address check as campaigns
    (streams.rules.addresses.is_valid_email) before SendEmail: an address SES must not be given ends
    `failed` with 'invalid_address:<why>' and an EmailFailed the order service hears, with no
    call; the mail behind it is sent. Naive version: the call is made (SES refuses it, or the
    stand-in takes it) and the row's reason says nothing about the address."""
    bad = {"dotless": "lan@example", "dots": "lan..tran@example.com", "space": "lan @example.com"}
    good = address("valid")
    with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
        for key, to in bad.items():
            enqueue_mail(conn, f"addr:{key}", to, "order_confirmation", DATA)
        enqueue_mail(conn, "addr:good", good, "order_confirmation", DATA)
    keys = [*(f"addr:{k}" for k in bad), "addr:good"]
    _, sender = with_sender(
        ms,
        lambda: wait_for("ended", lambda: all(status(ms, k) in ("sent", "failed") for k in keys)),
    )
    why = {"dotless": "bad_domain", "dots": "bad_local", "space": "whitespace"}
    for key, to in bad.items():
        row = mail_row(ms, f"addr:{key}")
        assert row and (row["status"], row["last_error"]) == (
            "failed",
            f"invalid_address:{why[key]}",
        )
        ((event, payload),) = outbox_events(ms, f"addr:{key}")
        assert (event, payload["reason"]) == ("EmailFailed", f"invalid_address:{why[key]}")
        assert provider_messages(ms, to) == []
    assert status(ms, "addr:good") == "sent" and len(provider_messages(ms, good)) == 1
    assert (sender.stats.invalid_address, sender.stats.sent) == (3, 1)
