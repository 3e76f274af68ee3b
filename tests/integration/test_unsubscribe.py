"""RFC 8058 one-click unsubscribe against the real webhook app, PostgreSQL and Kafka.

Seed traps: 6 (unsubscribed after the snapshot still mailed), 7 (scanners follow GET links),
8 (the one-click POST has no cookie and no CSRF token)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from flashsend import deliverability
from flashsend.lab.feedback_run import insert_users, wait_for, with_feedback
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from infra.process import free_port
from producers.campaign import start_campaign
from sinks.recipient_store import ClaimedRecipient
from streams.rules.unsubscribe_token import TokenKeys, make_token
from tests.integration.campaign_helpers import admin, new_campaign, wait_finished
from tests.integration.feedback_helpers import WebhookThread, codec, header, http, read_all

ONE_CLICK = b"List-Unsubscribe=One-Click"
USERS = 2_400
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def webhook(settings: Settings) -> Iterator[WebhookThread]:
    thread = WebhookThread(with_feedback(settings, relay_poll_s=0.1))
    yield thread
    thread.stop()


def opt_in(settings: Settings, user_id: int) -> tuple[bool, int]:
    """(users.marketing_opt_in, rows waiting in the webhook's outbox)."""
    with psycopg.connect(settings.pg_dsn) as conn:
        row = conn.execute("SELECT marketing_opt_in FROM users WHERE id = %s", (user_id,))
        outbox = conn.execute("SELECT count(*) FROM feedback_outbox").fetchone()
        value = row.fetchone()
    assert value is not None and outbox is not None
    return bool(value[0]), int(outbox[0])


def link(webhook: WebhookThread, user_id: int, campaign_id: int | None = 7) -> str:
    keys = deliverability.token_keys(webhook.settings)
    return f"{webhook.url}/u/{make_token(keys, user_id, campaign_id)}"


def test_get_changes_nothing_post_without_cookies_unsubscribes_once(
    webhook: WebhookThread,
) -> None:
    s = webhook.settings
    insert_users(s, 2, "unsub.flashsend.test")
    url = link(webhook, 1)
    page = http("GET", url)  # what a mail scanner does
    assert page.status == 200 and 'method="post"' in page.body
    assert 'name="List-Unsubscribe" value="One-Click"' in page.body
    assert opt_in(s, 1) == (True, 0), "GET must not unsubscribe (seed trap 7)"

    done = http("POST", url, ONE_CLICK, FORM)  # Gmail's one-click: no cookie, no CSRF token
    assert done.status == 200, done.body
    assert "Set-Cookie" not in done.headers and "Location" not in done.headers
    assert opt_in(s, 1) == (False, 1)
    assert http("POST", url, ONE_CLICK, FORM).status == 200  # repeated: harmless, no 2nd event
    assert opt_in(s, 1) == (False, 1)
    assert opt_in(s, 2) == (True, 1)

    [msg] = read_all(s, s.topic_mail_events, expect=1)  # via the outbox relay
    assert header(msg, "flashsend.schema") == "unsubscribed"
    assert msg.key() == b"u1@unsub.flashsend.test"
    event = codec(s, "unsubscribed").decode(msg.value())
    assert (event["user_id"], event["campaign_id"], event["method"]) == (1, 7, "one_click")


def test_tampered_unknown_or_malformed_requests_change_nothing(webhook: WebhookThread) -> None:
    s = webhook.settings
    insert_users(s, 2, "unsub.flashsend.test")
    url = link(webhook, 1)
    token = url.rsplit("/", 1)[1]
    flipped = token[:-3] + ("A" if token[-3] != "A" else "B") + token[-2:]
    other_key = TokenKeys("k9", {"k9": b"another-secret-of-32-bytes......"})
    forged = [
        f"{webhook.url}/u/{flipped}",  # edited token
        f"{webhook.url}/u/{make_token(other_key, 1, 7)}",  # signed with a key we do not hold
        f"{webhook.url}/u/{token}x",  # appended
        f"{webhook.url}/u/2",  # a bare user id (what a naive link would carry)
    ]
    for bad in forged:
        assert http("GET", bad).status == 403, bad
        assert http("POST", bad, ONE_CLICK, FORM).status == 403, bad
    assert http("POST", url, b"List-Unsubscribe=Maybe", FORM).status == 400
    assert opt_in(s, 1) == (True, 0) and opt_in(s, 2) == (True, 0)


def test_unsubscribe_works_with_kafka_down(settings: Settings) -> None:
    """PostgreSQL is the source of truth: the opt-out commits without the broker; the event
    waits in the outbox."""
    s = with_feedback(settings, kafka_bootstrap=f"127.0.0.1:{free_port()}")
    insert_users(s, 1, "unsub.flashsend.test")
    webhook = WebhookThread(s, relay=False, ensure_topics=False)
    try:
        assert http("POST", link(webhook, 1), ONE_CLICK, FORM).status == 200
        assert opt_in(s, 1) == (False, 1)
    finally:
        webhook.stop()


def test_user_unsubscribed_mid_campaign_is_skipped_by_the_next_batch(
    settings: Settings, tmp_path: Path
) -> None:
    """Seed trap 6: the snapshot was taken at 9:00, the user unsubscribes at 9:10, their batch
    runs at 9:20. The link used is the one the sender puts in the mail's headers."""
    s = with_feedback(settings)
    domain = f"mid-{uuid.uuid4().hex[:8]}.flashsend.test"
    insert_users(s, USERS, domain)
    # 6 s for 2,400 recipients; a lane claims at most 100 rows ahead of sending, so the last
    # user's row (~200th of its partition) is claimed ~3 s after the first mail.
    cid = new_campaign(s, rate=400)
    start_campaign(s, cid)
    webhook = WebhookThread(s)
    pool = WorkerPool(s, tmp_path)
    try:
        pool.start(1)
        first = wait_for(
            "first mail at SES", lambda: admin(s).messages(campaign=str(cid), limit=1), 60
        )
        sent_header = first[0]["headers"]["List-Unsubscribe"]
        assert sent_header.startswith(f"<{webhook.url}/u/") and sent_header.endswith(">")
        assert first[0]["headers"]["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
        # the last recipient's link, built exactly as the sender builds it
        late = ClaimedRecipient(cid, USERS, USERS, f"u{USERS}@{domain}", "Lan")
        late_url = deliverability.unsubscribe_headers(s)(late)["List-Unsubscribe"][1:-1]
        assert http("POST", late_url, ONE_CLICK, FORM).status == 200
        progress = wait_finished(s, cid, pool, timeout=120)
    finally:
        pool.stop()
        webhook.stop()
    with psycopg.connect(s.pg_dsn) as conn:
        row = conn.execute(
            "SELECT status, reason FROM campaign_recipients WHERE campaign_id = %s AND seq = %s",
            (cid, USERS),
        ).fetchone()
    assert row == ("skipped", "opted_out")
    assert admin(s).messages(destination=f"u{USERS}@{domain}") == []
    assert progress["sent"] == USERS - 1
