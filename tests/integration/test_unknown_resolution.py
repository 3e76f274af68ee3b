"""Rows in doubt settled by SES's events, on real PostgreSQL through the feedback agent's batch
handler (records encoded as the webhook encodes them). The whole loop — the stand-in's events,
the webhook process, mail.events, the feedback worker — runs in test_resend_unknown.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from flashsend.settings import Settings
from producers.campaign import snapshot
from producers.mail_topics import ensure_mail_topics
from sinks.queries import query as named
from streams.rules.feedback_logic import Thresholds
from tests.integration.campaign_helpers import progress, statuses
from tests.integration.test_feedback_agent import Feed, Rec, campaign, query

USERS = 12


@pytest.fixture
def feed(settings: Settings) -> Iterator[Feed]:
    ensure_mail_topics(settings)
    yield Feed(settings, Thresholds(complaint_rate=0.5, bounce_rate=0.5, min_sample=10**6))


def snapshotted(settings: Settings) -> int:
    """A sending campaign of USERS rows (seq = user id, `uN@r.test`) in its own partition."""
    cid = campaign(settings, status="draft")
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO users (id, email, first_name) "
            "SELECT g, 'u' || g || '@r.test', 'Lan' FROM generate_series(1, %s) g",
            (USERS,),
        )
        assert snapshot(conn, cid, "true") == USERS
    return cid


def set_rows(settings: Settings, cid: int, status: str, seqs: list[int], **cols: Any) -> None:
    """Rows in a given state, written through the parent like every writer (counters follow)."""
    sets = ", ".join(f"{k} = %({k})s" for k in cols)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(
            f"UPDATE campaign_recipients SET status = %(status)s{', ' + sets if sets else ''} "
            "WHERE campaign_id = %(cid)s AND seq = ANY(%(seqs)s)",
            {"status": status, "cid": cid, "seqs": seqs, **cols},
        )


def rows(settings: Settings, cid: int) -> dict[int, tuple[str, str | None, str | None]]:
    """seq → (status, reason, message_id)."""
    return {
        int(seq): (status, reason, message_id)
        for seq, status, reason, message_id in query(
            settings,
            "SELECT seq, status, reason, message_id FROM campaign_recipients "
            "WHERE campaign_id = %s ORDER BY seq",
            cid,
        )
    }


def event(feed: Feed, kind: str, cid: int, seq: int, **extra: Any) -> Rec:
    return feed.ses(kind, f"u{seq}@r.test", cid, seq=seq, **extra)


def test_events_settle_unknown_rows_and_the_counters_follow(feed: Feed, settings: Settings) -> None:
    cid = snapshotted(settings)
    set_rows(settings, cid, "unknown", [1, 2, 3, 4, 5, 6], reason="lease_expired")
    assert progress(settings, cid)["unknown"] == 6
    outcome = feed.apply(
        [
            event(feed, "Send", cid, 1),
            event(feed, "Delivery", cid, 2),
            event(feed, "Bounce", cid, 3, bounce_type="Permanent"),
            event(feed, "DeliveryDelay", cid, 4),
            event(feed, "Reject", cid, 5),
            event(feed, "Open", cid, 6),  # says nothing about the send
        ]
    )
    assert outcome.resolved == 5
    after = rows(settings, cid)
    assert {seq: after[seq][:2] for seq in range(1, 7)} == {
        1: ("sent", "resolved_by_event"),
        2: ("sent", "resolved_by_event"),
        3: ("sent", "resolved_by_event"),
        4: ("sent", "resolved_by_event"),
        5: ("failed", "resolved_by_event"),
        6: ("unknown", "lease_expired"),
    }
    assert all(after[seq][2] and after[seq][2].startswith("ses-") for seq in range(1, 6))
    # `campaign status` reads trigger-kept counters: they moved from unknown to sent/failed.
    assert statuses(settings, cid) == {"sent": 4, "failed": 1, "unknown": 1, "pending": 6}
    p = progress(settings, cid)
    assert (p["sent"], p["failed"], p["unknown"]) == (4, 1, 1)
    assert feed.stats["resolved"] == 5


def test_events_for_rows_not_in_doubt_change_nothing(feed: Feed, settings: Settings) -> None:
    cid = snapshotted(settings)
    set_rows(settings, cid, "sent", [1, 2], message_id="answered", sent_at=None)
    set_rows(settings, cid, "failed", [3], reason="MESSAGE_REJECTED")
    set_rows(settings, cid, "skipped", [4], reason="opted_out")
    set_rows(settings, cid, "cancelled", [5], reason="campaign_cancelled")
    set_rows(settings, cid, "unknown", [7, 8], reason="lease_expired")
    before = rows(settings, cid)
    outcome = feed.apply(
        [
            event(feed, "Send", cid, 1),
            event(feed, "Reject", cid, 2),  # a Reject cannot overturn an answered send
            event(feed, "Delivery", cid, 3),
            event(feed, "Send", cid, 4),
            event(feed, "Send", cid, 5),
            event(feed, "Send", cid, 6),  # pending, never claimed
            feed.ses("Send", "someone.else@r.test", cid, seq=7),  # the row's address differs
            event(feed, "Send", 999_999_999, 8),  # a campaign this database does not know
            feed.ses("Send", "u8@r.test", cid, seq=None),  # no seq tag
        ]
    )
    assert outcome.resolved == 0
    assert rows(settings, cid) == before
    assert statuses(settings, cid) == {
        "sent": 2,
        "failed": 1,
        "skipped": 1,
        "cancelled": 1,
        "unknown": 2,
        "pending": 5,
    }


def test_an_event_before_the_answer_settles_the_row_and_the_late_answer_changes_nothing(
    feed: Feed, settings: Settings
) -> None:
    """A worker killed mid-call leaves its rows `sending` until the lease makes them unknown;
    SES's events usually arrive long before. They settle the row then, and the lease, a late
    answer or a late timeout find nothing to change."""
    cid = snapshotted(settings)
    set_rows(settings, cid, "sending", [1, 2], claimed_at=None)
    assert feed.apply([event(feed, "Send", cid, 1)]).resolved == 1
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        record = sql.SQL(named("record_results")).format(
            partition=sql.Identifier("campaign_recipients")
        )
        claims = dict(
            conn.execute(
                "SELECT seq, attempts FROM campaign_recipients WHERE campaign_id = %s "
                "AND seq = ANY(%s)",
                (cid, [1, 2]),
            ).fetchall()
        )
        conn.execute(
            record,
            {
                "campaign_id": cid,
                "seqs": [1, 2],
                "statuses": ["unknown", "unknown"],
                "reasons": ["ses_timeout", "ses_timeout"],
                "message_ids": [None, None],
                "attempts": [claims[1], claims[2]],  # the answer comes under the row's claim
            },
        )
    after = rows(settings, cid)
    assert after[1][:2] == ("sent", "event_before_answer")
    assert after[2][:2] == ("unknown", "ses_timeout")
    assert statuses(settings, cid)["sent"] == 1


def test_a_reject_after_the_send_turns_the_row_failed(feed: Feed, settings: Settings) -> None:
    """SES publishes Send, then Reject, for a message it rejects: in one batch the Reject
    wins; in two batches it overturns the sent that the Send made."""
    cid = snapshotted(settings)
    set_rows(settings, cid, "unknown", [1, 2], reason="lease_expired")
    assert feed.apply([event(feed, "Send", cid, 1), event(feed, "Reject", cid, 1)]).resolved == 1
    assert feed.apply([event(feed, "Send", cid, 2)]).resolved == 1
    assert feed.apply([event(feed, "Reject", cid, 2)]).resolved == 1
    after = rows(settings, cid)
    assert after[1][:2] == after[2][:2] == ("failed", "resolved_by_event")
    assert statuses(settings, cid) == {"failed": 2, "pending": USERS - 2}
    # The same events again (SNS redelivers): nothing more changes.
    assert feed.apply([event(feed, "Send", cid, 1), event(feed, "Send", cid, 2)]).resolved == 0


def test_a_row_queued_again_is_settled_by_a_late_event_of_its_first_send(
    feed: Feed, settings: Settings
) -> None:
    cid = snapshotted(settings)
    set_rows(settings, cid, "pending", [1], reason="resend_unknown", requeue=True)
    assert statuses(settings, cid) == {"pending": USERS}  # one of them flagged requeue
    assert feed.apply([event(feed, "Delivery", cid, 1)]).resolved == 1
    assert rows(settings, cid)[1][:2] == ("sent", "resolved_by_event")
    assert query(
        settings, "SELECT requeue FROM campaign_recipients WHERE campaign_id = %s AND seq = 1", cid
    ) == [(False,)]
    assert statuses(settings, cid) == {"sent": 1, "pending": USERS - 1}


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_the_proofs_are_read_once_even_when_statistics_say_no_row_is_in_doubt(
    settings: Settings,
) -> None:
    """A campaign's statistics are taken at its snapshot, when every row is pending. After a
    crash thousands of its rows are unknown; with a plain join the planner believed none was,
    scanned the partition once and the batch's proofs once per row found (10,000 times here:
    seconds per batch). Each proof must probe its own row."""
    cid = campaign(settings, status="draft")
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO users (id, email, first_name) "
            "SELECT g, 'u' || g || '@r.test', 'Lan' FROM generate_series(1, 20000) g"
        )
        assert snapshot(conn, cid, "true") == 20_000  # ANALYZEs the partition: all pending
        conn.execute(f"ALTER TABLE campaign_recipients_{cid} SET (autovacuum_enabled = false)")
    set_rows(settings, cid, "unknown", list(range(1, 10_001)), reason="lease_expired")
    seqs = list(range(1, 501))
    params = {
        "campaign_ids": [cid] * len(seqs),
        "campaigns": [cid],
        "seqs": seqs,
        "emails": [f"u{q}@r.test" for q in seqs],
        "outcomes": ["sent"] * len(seqs),
        "message_ids": [f"m{q}" for q in seqs],
        "at_ms": [0] * len(seqs),
    }
    with psycopg.connect(settings.pg_dsn) as conn:
        [(plan,)] = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + named("resolve_in_doubt"), params
        ).fetchall()
        conn.rollback()
    nodes = list(_nodes(plan[0]["Plan"]))
    proofs = [n for n in nodes if n["Node Type"] == "Function Scan"]
    assert proofs and all(n["Actual Loops"] == 1 for n in proofs), proofs
    assert plan[0]["Plan"]["Actual Rows"] == 500
