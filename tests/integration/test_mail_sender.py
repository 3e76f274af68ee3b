"""The transactional sender against PostgreSQL and the SES stand-in over HTTP (real boto3).

Faults (hangs, latency, 429) are set on the shared stand-in for one block at a time, and every
test mails its own addresses, so provider-side counts are exact.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from flashsend.settings import Settings
from infra.process import free_port
from sinks.mail_enqueue import cancel_mail, enqueue_mail
from sinks.ses import SesSender, make_client
from streams.mail_app import sender_config
from streams.mail_sender import MailSender
from streams.rules.mail_logic import CancelResult, Delivery, check_lease
from tests.conftest import LocalStack
from tests.integration.mail_fixtures import (
    address,
    faults,
    lifecycle,
    mail_row,
    mail_settings,
    open_pool,
    provider_messages,
    put_templates,
    store_for,
)


@pytest.fixture
def ms(stack: LocalStack) -> Settings:
    settings = mail_settings(stack, mail_ses_timeout_s=3.0)
    put_templates(settings)
    return settings


def enqueue(settings: Settings, key: str, to: str, **kw: Any) -> None:
    with psycopg.connect(settings.pg_dsn) as conn, conn.transaction():
        enqueue_mail(
            conn,
            key,
            to,
            "order_confirmation",
            {"order_id": 1, "customer_name": "Lan", "total": "1", "currency": "VND"},
            **kw,
        )


def status(settings: Settings, key: str) -> str | None:
    row = mail_row(settings, key)
    return None if row is None else str(row["status"])


async def run_senders(
    settings: Settings,
    until: Callable[[], bool],
    *,
    timeout: float = 20.0,
    configs: list[dict[str, Any]] | None = None,
    during: Callable[[], None] | None = None,
    endpoint_settings: Settings | None = None,
) -> list[MailSender]:
    """Run one MailSender per config (overrides of the settings' config) until `until()`."""
    pool = await open_pool(settings, size=10)
    senders: list[MailSender] = []
    try:
        store = store_for(settings, pool)
        ses_settings = endpoint_settings or settings
        for overrides in configs or [{}]:
            config = replace(sender_config(settings), **overrides)
            ses = SesSender(make_client(ses_settings, timeout=settings.mail_ses_timeout_s))
            sender = MailSender(config=config, store=store, ses=ses, listen_dsn=settings.pg_dsn)
            sender.start()
            senders.append(sender)
            await asyncio.sleep(0.05)
        deadline = time.monotonic() + timeout
        ran_during = False
        while not await asyncio.to_thread(until):
            if during is not None and not ran_during:
                ran_during = True
                await asyncio.to_thread(during)
            assert time.monotonic() < deadline, "condition not reached"
            await asyncio.sleep(0.1)
    finally:
        for sender in senders:
            await sender.stop(grace_s=5)
        await pool.close()
    return senders


def test_no_answer_at_most_once_unknown_at_least_once_resent(stack: LocalStack) -> None:
    """Section 0 / step 4: SES accepts the mail and never answers. An at-most-once template
    becomes `unknown` (one mail, maybe zero — never resent); an at-least-once template is
    resent (the customer may get two, never zero). The naive retry-on-error sends the
    at-most-once mail twice (botocore's own retries included: the stand-in counts one
    message)."""
    ms = mail_settings(stack, mail_ses_timeout_s=1.0)
    put_templates(ms)
    once, twice = address("amo"), address("alo")
    enqueue(ms, "payment:1", once, delivery=Delivery.AT_MOST_ONCE)
    enqueue(ms, "otp:1", twice)
    with faults(ms, p_hang=1.0):
        asyncio.run(
            run_senders(
                ms,
                lambda: (
                    status(ms, "payment:1") == "unknown"
                    and (mail_row(ms, "otp:1") or {}).get("send_errors", 0) >= 1
                ),
            )
        )
    asyncio.run(run_senders(ms, lambda: status(ms, "otp:1") == "sent"))
    assert len(provider_messages(ms, once)) == 1 and status(ms, "payment:1") == "unknown"
    # The honest duplicate: every unanswered call may have delivered (the stand-in did).
    alo = mail_row(ms, "otp:1")
    assert alo and alo["attempts"] >= 2 and len(provider_messages(ms, twice)) == alo["attempts"]
    assert lifecycle(ms, "payment:1") == ["EmailFailed"]
    assert lifecycle(ms, "otp:1") == ["EmailSent"]
    # The defaults leave a send's worst case (timeout, no retry) inside the lease.
    check_lease(Settings().mail_lease_s, Settings().mail_ses_timeout_s)


def test_slow_worker_past_its_lease_is_fenced(ms: Settings) -> None:
    """Layer 3 on the real path: worker A (lease 0.5 s, too short) is still in a 1.2 s call
    when B re-claims; A's late outcome is fenced, B's is kept. Two mails reach the provider —
    the fencing token keeps the STATE right, only a lease longer than the slowest call
    prevents the second mail (which test_no_answer… checks)."""
    to = address("slow")
    enqueue(ms, "order-confirmed:80", to)
    with faults(ms, latency_ms=1200):
        a, b = asyncio.run(
            run_senders(
                ms,
                lambda: (
                    status(ms, "order-confirmed:80") == "sent"
                    and len(provider_messages(ms, to)) == 2
                ),
                configs=[{"lease_s": 0.5, "concurrency": 1}, {"lease_s": 30.0}],
            )
        )
    row = mail_row(ms, "order-confirmed:80")
    assert row and row["attempts"] == 2
    assert a.stats.fenced == 1 and b.stats.sent == 1
    assert row["provider_id"] == provider_messages(ms, to)[-1]["message_id"]
    assert lifecycle(ms, "order-confirmed:80") == ["EmailSent"]


def test_no_transaction_open_during_the_call(ms: Settings) -> None:
    """Architecture-1 trap 4: claim, COMMIT, then call SES. During a slow call the row is
    visibly `sending` to other sessions and no transaction of ours stays open across it: a
    transaction idle at two looks 0.6 s apart within the 1.5-s call would be one held over
    the call (a look alone may catch a short one between its statements on a busy machine)."""
    to = address("tx")
    enqueue(ms, "order-confirmed:81", to)
    seen: dict[str, Any] = {}
    idle = (
        "SELECT pid, xact_start FROM pg_stat_activity WHERE datname = current_database() "
        "AND state LIKE 'idle in transaction%%'"
    )

    def look() -> None:
        time.sleep(0.5)
        with psycopg.connect(ms.pg_dsn, autocommit=True) as conn:
            seen["status"] = status(ms, "order-confirmed:81")
            first = set(conn.execute(idle).fetchall())
            time.sleep(0.6)
            seen["held_across"] = first & set(conn.execute(idle).fetchall())
            seen["still"] = status(ms, "order-confirmed:81")

    with faults(ms, latency_ms=1500):
        asyncio.run(
            run_senders(ms, lambda: status(ms, "order-confirmed:81") == "sent", during=look)
        )
    assert seen == {"status": "sending", "held_across": set(), "still": "sending"}, seen


def test_explicit_failures_retry_with_backoff_then_fail(ms: Settings, stack: LocalStack) -> None:
    """A connection refused before anything was sent is retried with backoff + jitter up to
    the limit, then `failed` with EmailFailed. A 429 does not spend that budget."""
    enqueue(ms, "order-confirmed:82", address("refused"))
    dead = stack.settings_for(ses_endpoint=f"http://127.0.0.1:{free_port()}")
    asyncio.run(
        run_senders(
            ms,
            lambda: status(ms, "order-confirmed:82") == "failed",
            configs=[{"retry": replace(sender_config(ms).retry, max_attempts=2)}],
            endpoint_settings=dead,
        )
    )
    row = mail_row(ms, "order-confirmed:82")
    assert row and (row["attempts"], row["send_errors"]) == (3, 3)
    assert "retries_exhausted" in row["last_error"]
    assert lifecycle(ms, "order-confirmed:82") == ["EmailFailed"]

    to = address("throttled")
    enqueue(ms, "order-confirmed:83", to)
    with faults(ms, p429=1.0):
        asyncio.run(
            run_senders(
                ms,
                # Waiting for `pending` too: the row is `sending` while a call is out.
                lambda: (
                    (row := mail_row(ms, "order-confirmed:83") or {}).get("attempts", 0) >= 4
                    and row["status"] == "pending"
                ),
                configs=[{"retry": replace(sender_config(ms).retry, max_attempts=2)}],
            )
        )
    row = mail_row(ms, "order-confirmed:83")
    assert row and row["status"] == "pending" and row["send_errors"] == 0
    asyncio.run(run_senders(ms, lambda: status(ms, "order-confirmed:83") == "sent"))
    assert len(provider_messages(ms, to)) == 1


def test_cancel_during_send_is_reported_too_late(ms: Settings) -> None:
    """C2 with a real call: the cancel arrives while SES is being called. The mail goes; the
    row ends `sent` (never `cancelled`: cancel trap 1) and EmailCancelTooLate follows EmailSent,
    so the order service tells the customer the truth (cancel trap 6)."""
    to = address("inflight")
    enqueue(ms, "order-confirmed:84", to, ref="84")
    got: list[Any] = []

    def cancel_now() -> None:
        time.sleep(0.3)
        with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
            got.extend(cancel_mail(conn, ["order-confirmed:84"], ref="84"))

    with faults(ms, latency_ms=1000):
        asyncio.run(
            run_senders(ms, lambda: status(ms, "order-confirmed:84") == "sent", during=cancel_now)
        )
    assert got == [("order-confirmed:84", CancelResult.IN_FLIGHT)]
    assert lifecycle(ms, "order-confirmed:84") == ["EmailSent", "EmailCancelTooLate"]
    assert len(provider_messages(ms, to)) == 1


def test_delayed_mail_and_transactional_rate(ms: Settings) -> None:
    """Delayed mail is a column: not sent before send_after, and one cancelled before its time
    is never sent. Transactional sends are paced at their own rate (share of MaxSendRate) and
    carry their own configuration set."""
    soon, cancelled = address("soon"), address("never")
    due = datetime.now(UTC) + timedelta(seconds=1.5)
    enqueue(ms, "reminder:1", soon, send_after=due)
    enqueue(
        ms, "reminder:2", cancelled, ref="2", send_after=datetime.now(UTC) + timedelta(seconds=1.0)
    )
    with psycopg.connect(ms.pg_dsn) as conn, conn.transaction():
        assert cancel_mail(conn, ["reminder:2"]) == [("reminder:2", CancelResult.CANCELLED)]
    bulk = [address("rate") for _ in range(30)]
    for i, to in enumerate(bulk):
        enqueue(ms, f"bulk:{i}", to)
    asyncio.run(
        run_senders(
            ms,
            lambda: (
                status(ms, "reminder:1") == "sent"
                and all(status(ms, f"bulk:{i}") == "sent" for i in range(30))
            ),
            configs=[{"rate": 20.0, "burst": 5}],
        )
    )
    (msg,) = provider_messages(ms, soon)
    assert msg["time"] >= due.timestamp() - 0.05  # the stand-in's clock is this machine's
    assert provider_messages(ms, cancelled) == []
    times = sorted(provider_messages(ms, to)[0]["time"] for to in bulk)
    densest = max(sum(1 for t in times if s <= t < s + 1.0) for s in times)
    assert densest <= 5 + 20 + 1, f"{densest} transactional mails in one second at 20/s"
    assert msg["configuration_set"] == ms.transactional_configuration_set


def test_a_stop_during_a_claim_leaves_no_mail_sending(ms: Settings) -> None:
    """A stop that lands while the claim loop is waiting for PostgreSQL: the mails that claim
    returns still get their call and their outcome (or none is claimed); none is left
    `sending` for the lease to turn unknown or resend."""

    async def start_then_stop(delay: float) -> None:
        pool = await open_pool(ms, size=4)
        try:
            ses = SesSender(make_client(ms, timeout=ms.mail_ses_timeout_s))
            sender = MailSender(config=sender_config(ms), store=store_for(ms, pool), ses=ses)
            sender.start()
            await asyncio.sleep(delay)  # the first claim is on its way
            # The loop stands still while PostgreSQL answers what was sent (a busy worker):
            # when that was the claim's COMMIT, the stop comes after the claim, before its calls.
            time.sleep(0.05)
            await sender.stop(grace_s=5)
        finally:
            await pool.close()

    left = []
    for i in range(40):
        key = f"stop-during-claim:{i}"
        enqueue(ms, key, address(f"stop{i}"))
        asyncio.run(start_then_stop(0.0002 * i))
        if status(ms, key) == "sending":
            left.append(key)
    assert left == []
