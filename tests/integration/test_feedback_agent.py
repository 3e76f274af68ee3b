"""The feedback agent's batch handler on real PostgreSQL (and the real DLQ topic): what each
event does, exactly once, and when a campaign pauses itself. The Faust app around it runs in
test_feedback_loop.py."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool

from flashsend.settings import Settings
from producers.dlq import DeadLetterProducer
from producers.mail_topics import ensure_mail_topics
from producers.ses_events import event_id
from sinks.feedback_store import ApplyOutcome, FeedbackStore
from sinks.offsets import Assignment
from streams.feedback_ingest import FeedbackIngest
from streams.rules.feedback_logic import Thresholds
from tests.integration.feedback_helpers import codec, header, read_all


@dataclass
class Rec:
    """A consumed record as the agent sees it (topic, partition, offset, key, value, headers)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


class Feed:
    """Encodes events like the webhook and the outbox relay do, and feeds them to the agent."""

    def __init__(self, settings: Settings, thresholds: Thresholds) -> None:
        self.settings = settings
        self.thresholds = thresholds
        self.ses_codec = codec(settings, "ses_event")
        self.unsub_codec = codec(settings, "unsubscribed")
        self.offset = 0

    def ses(self, event_type: str, to: str, campaign: int | None = None, **extra: Any) -> Rec:
        message_id = f"ses-{uuid.uuid4()}"
        record = {
            "event_id": event_id(message_id, event_type, to),
            "event_type": event_type,
            "version": 1,
            "occurred_at": 0,
            "recipient": to,
            "ses_message_id": message_id,
            "sns_message_id": str(uuid.uuid4()),
            "campaign_id": campaign,
            "seq": None,
            "configuration_set": "marketing",
            "tags": {},
            "bounce_type": None,
            "bounce_sub_type": None,
            "complaint_type": None,
            "detail": None,
            "source": "event_publishing",
            "received_at": 0,
            **extra,
        }
        return self.rec(to, self.ses_codec.encode(record), "ses_event")

    def rec(self, key: str, value: bytes, schema: str | None) -> Rec:
        self.offset += 1
        headers = [] if schema is None else [("flashsend.schema", schema.encode())]
        return Rec(self.settings.topic_mail_events, 0, self.offset, key.encode(), value, headers)

    def apply(self, records: list[Rec]) -> ApplyOutcome:
        async def run() -> ApplyOutcome:
            pool = AsyncConnectionPool(
                self.settings.pg_dsn,
                min_size=1,
                max_size=2,
                open=False,
                kwargs={"autocommit": True},
            )
            await pool.open()
            try:
                store = FeedbackStore(
                    pool,
                    group_id="feedback-test",
                    topic=self.settings.topic_mail_events,
                    thresholds=self.thresholds,
                )
                await store.offsets.take(Assignment.of(store.topic, [0]))
                ingest = FeedbackIngest(
                    store=store,
                    ses_codec=self.ses_codec,
                    unsubscribed_codec=self.unsub_codec,
                    dlq=DeadLetterProducer(self.settings.kafka_bootstrap, self.settings.topic_dlq),
                )
                outcome = await ingest.handle(records)
                assert outcome is not None
                self.stats = ingest.stats
                return outcome
            finally:
                await pool.close()

        return asyncio.run(run())


@pytest.fixture
def feed(settings: Settings) -> Iterator[Feed]:
    yield Feed(settings, Thresholds(complaint_rate=0.001, bounce_rate=0.05, min_sample=100))


def campaign(settings: Settings, status: str = "sending") -> int:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO campaigns (name, template, from_address, audience_condition, status) "
            "VALUES ('t', 't', 'a@b.test', 'true', %s) RETURNING id",
            (status,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def query(settings: Settings, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return conn.execute(sql, args).fetchall()


def counters(settings: Settings, cid: int) -> dict[str, int]:
    rows = query(
        settings,
        "SELECT delivered, bounced, soft_bounced, complained, unsubscribed FROM campaign_feedback "
        "WHERE campaign_id = %s",
        cid,
    )
    names = ("delivered", "bounced", "soft_bounced", "complained", "unsubscribed")
    return dict(zip(names, rows[0], strict=True)) if rows else {}


def test_each_event_does_what_it_must_exactly_once(feed: Feed, settings: Settings) -> None:
    ensure_mail_topics(settings)
    cid = campaign(settings, status="done")
    records = [
        feed.ses("Delivery", "a@x.test", cid),
        feed.ses("Bounce", "hard@x.test", cid, bounce_type="Permanent", bounce_sub_type="General"),
        feed.ses(
            "Bounce", "full@x.test", cid, bounce_type="Transient", bounce_sub_type="MailboxFull"
        ),
        feed.ses("Bounce", "what@x.test", cid, bounce_type="Undetermined"),
        feed.ses("Complaint", "angry@x.test", cid, complaint_type="abuse"),
        feed.ses("Bounce", "bounce@simulator.amazonses.com", cid, bounce_type="Permanent"),
        feed.ses("Complaint", "complaint@simulator.amazonses.com", cid),
        feed.ses("Complaint", "order@x.test", None),  # transactional mail: suppress, count nowhere
        feed.ses("Delivery", "b@x.test", 999_999_999),  # a campaign this database does not know
        feed.rec(
            "u@x.test",
            feed.unsub_codec.encode(
                {
                    "event_id": str(uuid.uuid4()),
                    "event_type": "Unsubscribed",
                    "version": 1,
                    "occurred_at": 0,
                    "dedupe_key": "unsubscribed:1:x",
                    "user_id": 1,
                    "campaign_id": cid,
                    "email": "u@x.test",
                    "key_id": "local",
                    "method": "one_click",
                }
            ),
            "unsubscribed",
        ),
        feed.rec("order-1", b"\x00\x00\x00\x00\x02lifecycle", "mail_lifecycle"),  # not ours
        feed.rec("x", b"no header at all", None),  # not ours either
        feed.rec("y", b"garbage", "ses_event"),  # ours but unreadable: DLQ
    ]
    outcome = feed.apply(records)
    assert (outcome.fresh, outcome.suppressed, outcome.paused) == (10, 3, [])
    assert dict(query(settings, "SELECT email, reason FROM email_suppressions")) == {
        "hard@x.test": "bounce",
        "angry@x.test": "complaint",
        "order@x.test": "complaint",
    }
    [(source,)] = query(
        settings, "SELECT source_event FROM email_suppressions WHERE email = 'hard@x.test'"
    )
    assert source.startswith("Bounce Permanent/General ses:")
    assert counters(settings, cid) == {
        "delivered": 1,
        "bounced": 1,
        "soft_bounced": 2,
        "complained": 1,
        "unsubscribed": 1,
    }
    assert feed.stats["skipped:mail_lifecycle"] == 1 and feed.stats["skipped:no_header"] == 1
    [letter] = read_all(settings, settings.topic_dlq, expect=1)
    assert header(letter, "flashsend.reason") == "not_avro"

    # SNS delivered the same events again (a second webhook publish): new offsets, same ids.
    again = [Rec(r.topic, r.partition, r.offset + 100, r.key, r.value, r.headers) for r in records]
    assert feed.apply(again[:10]).fresh == 0
    assert counters(settings, cid)["soft_bounced"] == 2
    # A redelivery of offsets already applied is skipped, record by record.
    assert feed.apply(records[:2]).fenced == 2


def test_one_event_twice_in_one_batch_counts_once(feed: Feed, settings: Settings) -> None:
    """SNS delivered one event twice within a batch, once with its id in upper case."""
    ensure_mail_topics(settings)
    cid = campaign(settings, status="done")
    first = feed.ses("Delivery", "twice@x.test", cid)
    message_id = f"ses-{uuid.uuid4()}"
    bounce_id = event_id(message_id, "Bounce", "hard@x.test")
    bounce, bounce_upper = (
        feed.ses(
            "Bounce",
            "hard@x.test",
            cid,
            bounce_type="Permanent",
            ses_message_id=message_id,
            event_id=spelling,
        )
        for spelling in (bounce_id, bounce_id.upper())
    )
    again = Rec(first.topic, 0, feed.offset + 1, first.key, first.value, first.headers)
    feed.offset += 1
    outcome = feed.apply([first, bounce, again, bounce_upper])
    assert outcome.fresh == 2
    assert counters(settings, cid) == {
        "delivered": 1,
        "bounced": 1,
        "soft_bounced": 0,
        "complained": 0,
        "unsubscribed": 0,
    }


def test_complaint_rate_pauses_after_the_minimum_sample_then_judges_new_mail(
    feed: Feed, settings: Settings
) -> None:
    cid = campaign(settings)
    complaint = feed.ses("Complaint", "c0@x.test", cid)
    early = [feed.ses("Delivery", f"d{i}@x.test", cid) for i in range(50)] + [complaint]
    assert feed.apply(early).paused == []  # 2 % of 50: noise below the minimum sample
    more = [feed.ses("Delivery", f"e{i}@x.test", cid) for i in range(50)]
    [(paused_id, reason)] = feed.apply(more).paused  # 1 of 100 = 1 % > 0.1 %
    assert paused_id == cid and reason.startswith("auto: complaint rate 1.00% > 0.10%")
    assert query(settings, "SELECT status, reason FROM campaigns WHERE id = %s", cid) == [
        ("paused", reason)
    ]
    # An operator resumes (after narrowing the audience): old complaints do not pause it again.
    query(settings, "UPDATE campaigns SET status = 'sending' WHERE id = %s RETURNING id", cid)
    clean = [feed.ses("Delivery", f"f{i}@x.test", cid) for i in range(150)]
    assert feed.apply(clean).paused == []
    bad = [feed.ses("Complaint", f"f{i}@x.test", cid) for i in range(2)]
    assert [p[0] for p in feed.apply(bad).paused] == [cid]  # 2 of 150 new: 1.33 %


def test_hard_bounce_rate_pauses_and_a_finished_campaign_is_only_reported(
    feed: Feed, settings: Settings
) -> None:
    sending, done = campaign(settings), campaign(settings, status="done")
    for cid in (sending, done):
        events = [feed.ses("Delivery", f"{cid}-{i}@x.test", cid) for i in range(94)]
        events += [
            feed.ses("Bounce", f"{cid}-b{i}@x.test", cid, bounce_type="Permanent") for i in range(6)
        ]
        outcome = feed.apply(events)
    assert query(settings, "SELECT status FROM campaigns WHERE id = %s", sending) == [("paused",)]
    assert query(settings, "SELECT status FROM campaigns WHERE id = %s", done) == [("done",)]
    assert [(c, s) for c, s, _ in outcome.over_threshold] == [(done, "done")]
    [(reason,)] = query(settings, "SELECT reason FROM campaigns WHERE id = %s", sending)
    assert reason.startswith("auto: hard bounce rate 6.00% > 5.00%")


def test_suppressions_match_whatever_case_the_user_table_has(settings: Settings) -> None:
    """Bounces come back lower-cased; the users table may not be. Both the snapshot and the
    pre-send re-check must still find the suppression."""
    from producers.campaign import snapshot
    from sinks.queries import query as named

    cid = campaign(settings, status="draft")
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO users (id, email) VALUES (1, 'Jane.Doe@Example.COM'), (2, 'ok@x.test')"
        )
        conn.execute(
            "INSERT INTO email_suppressions (email, reason) "
            "VALUES ('jane.doe@example.com', 'bounce')"
        )
        assert snapshot(conn, cid, "true") == 1  # only ok@x.test
        conn.execute(  # a row snapshotted before the bounce arrived
            "INSERT INTO campaign_recipients (campaign_id, seq, user_id, email) "
            "VALUES (%s, 2, 1, 'Jane.Doe@Example.COM')",
            (cid,),
        )
        rows = conn.execute(
            named("claim_batch"), {"campaign_ids": [cid], "campaigns": [cid], "seqs": [2]}
        ).fetchall()
    assert [(r[1], r[5]) for r in rows] == [(2, "skipped")]
    assert query(settings, "SELECT reason FROM campaign_recipients WHERE seq = 2") == [
        ("suppressed:bounce",)
    ]


def test_opens_and_clicks_date_the_user_behind_the_mail(feed: Feed, settings: Settings) -> None:
    """What `--waves` orders by: the latest Open and Click of the user the row was mailed to;
    an older or redelivered event moves nothing back, another address's event moves nothing."""
    from producers.campaign import snapshot

    ensure_mail_topics(settings)
    cid = campaign(settings, status="draft")
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO users (id, email) VALUES (7, 'Open.Er@X.test'), (8, 'quiet@x.test')"
        )
        snapshot(conn, cid, "u.id IN (7, 8)")
        seqs = dict(
            conn.execute(
                "SELECT user_id, seq FROM campaign_recipients WHERE campaign_id = %s", (cid,)
            ).fetchall()
        )
    t = 1_800_000_000_000  # ms
    opened = feed.ses("Open", "open.er@x.test", cid, seq=seqs[7], occurred_at=t)
    assert feed.apply([opened]).fresh == 1
    assert feed.apply([opened]).fresh == 0  # redelivered: nothing new
    feed.apply(
        [
            feed.ses("Open", "open.er@x.test", cid, seq=seqs[7], occurred_at=t - 60_000),
            feed.ses("Click", "open.er@x.test", cid, seq=seqs[7], occurred_at=t + 5_000),
            feed.ses("Open", "someone.else@x.test", cid, seq=seqs[8], occurred_at=t),
            feed.ses("Delivery", "quiet@x.test", cid, seq=seqs[8], occurred_at=t),
        ]
    )
    rows = query(
        settings,
        "SELECT id, extract(epoch FROM last_open_at)::bigint, "
        "extract(epoch FROM last_click_at)::bigint FROM users WHERE id IN (7, 8) ORDER BY id",
    )
    assert rows == [(7, t // 1000, t // 1000 + 5), (8, None, None)]
