"""Reconcile a campaign: the repair loop that makes "Kafka carries work, Postgres is the truth"
hold after any incident. Safe at any time, any number of times, concurrently:

1. rows `sending` past the lease → `unknown` (never resent automatically);
2. rows released without a send (`requeue`) → produced again (taking the flag is the claim);
3. rows still `pending` although every doorbell has been consumed (stored offsets have reached
   the end of every partition) → produced again: their message is gone;
4. a seed hold that has run out → the audience released and produced (producers.seed_hold);
5. an A/B test whose holdout wait is over → its winner is set and the holdout produced
   (producers.ab_winner);
6. a scheduled campaign's slots that have come due (by the reconciler's clock) → released
   and produced (producers.send_schedule);
7. nothing pending, sending or held → the campaign is `done`.

Run by `flashsend campaign reconcile ID` and on a timer by every worker while a campaign is
sending. Duplicate doorbells are harmless: claims are conditional.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition

from flashsend.errors import FlashsendError
from flashsend.settings import Settings
from producers.ab_winner import decide
from producers.doorbells import DoorbellProducer
from producers.seed_hold import release_due as release_hold
from producers.send_schedule import release_due
from schemas import serde
from schemas.doorbell import DOORBELL_BATCH_RECORDS, DoorbellWriter
from sinks.campaign_store import CampaignStore
from sinks.queries import query


@dataclass(frozen=True)
class ReconcileResult:
    campaign_id: int
    expired: int
    requeued: int
    orphans: int
    done: bool
    skipped_locked: bool = False
    winner: str | None = None  # the A/B winner this pass set (its holdout produced now)
    hold_released: bool = False  # this pass ended a seed hold (its audience produced now)

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def utc_now() -> datetime:
    return datetime.now(UTC)


class Reconciler:
    def __init__(self, settings: Settings, clock: Callable[[], datetime] = utc_now) -> None:
        self.settings = settings
        self.clock = clock  # when the A/B wait ends and schedule slots come due
        self._scanned: set[int] = set()  # campaigns this reconciler has scanned once
        self._watermarks: Consumer | None = None
        self._codec = serde.codec(settings, "campaign_recipient")
        self._producer = Producer(
            {
                "bootstrap.servers": settings.kafka_bootstrap,
                "enable.idempotence": True,
                "linger.ms": 10,
                "compression.type": "lz4",
                "batch.num.messages": DOORBELL_BATCH_RECORDS,  # resume re-produces many at once
            }
        )

    def _offsets_client(self) -> Consumer:
        """One client for the watermark queries, kept for the reconciler's life: the workers'
        reconciler asks on every tick while a campaign has pending rows, and a new client per
        tick meant a new connection, metadata and teardown each time. It never subscribes
        (no group membership); librdkafka reconnects it after a broker restart."""
        if self._watermarks is None:
            s = self.settings
            self._watermarks = Consumer(
                {
                    "bootstrap.servers": s.kafka_bootstrap,
                    "group.id": f"{s.group_sender}-reconcile",
                    "enable.auto.commit": False,
                }
            )
        return self._watermarks

    def close(self) -> None:
        """Close the kept watermark client; the reconciler opens a new one if used again."""
        if self._watermarks is not None:
            self._watermarks.close()
            self._watermarks = None

    def __enter__(self) -> Reconciler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def log_end_offsets(self) -> dict[int, int]:
        s = self.settings
        consumer = self._offsets_client()
        md = consumer.list_topics(s.topic_recipients, timeout=10)
        topic = md.topics.get(s.topic_recipients)
        if topic is None or topic.error is not None:
            return {}
        return {
            p: consumer.get_watermark_offsets(TopicPartition(s.topic_recipients, p), timeout=10)[1]
            for p in topic.partitions
        }

    def consumed_everything(self, conn: psycopg.Connection[Any]) -> bool:
        """True when the stored offsets have reached the log end of every partition."""
        ends = self.log_end_offsets()
        if not ends:
            return False
        stored = dict(
            conn.execute(
                query("stored_offsets"),
                {
                    "group_id": self.settings.group_sender,
                    "topic": self.settings.topic_recipients,
                },
            ).fetchall()
        )
        return all(end == 0 or stored.get(p, 0) >= end for p, end in ends.items())

    def produce(self, campaign_id: int, rows: Sequence[tuple[int, int]]) -> None:
        errors: list[str] = []
        doorbells = DoorbellProducer(
            self._producer,
            self.settings.topic_recipients,
            DoorbellWriter(self._codec, campaign_id, int(time.time() * 1000)),
            lambda err, _m: errors.append(str(err)) if err else None,
        )
        doorbells.add(rows)
        doorbells.flush()
        if self._producer.flush(60) or errors:
            raise FlashsendError(f"re-produce failed: {errors[:3]}")

    def _counts(self, conn: psycopg.Connection[Any], campaign_id: int) -> tuple[int, int, int, int]:
        """(pending, sending, flagged for requeue, held: an A/B test's holdout waiting for its
        winner), from the trigger-kept counters."""
        row = conn.execute(query("pending_count"), {"campaign_id": campaign_id}).fetchone()
        return (int(row[0]), int(row[1]), int(row[2]), int(row[3])) if row else (0, 0, 0, 0)

    def _expiry_due(self, conn: psycopg.Connection[Any], campaign_id: int, lease: float) -> bool:
        """Expiring leases scans the campaign's rows, so the workers' reconcilers take turns:
        one scan per campaign every quarter lease, whichever worker's tick comes first
        (`claim_lease_check`), so a row is declared unknown between 1 and 1.25 leases after
        its claim however many workers run. A fresh reconciler (the CLI, a worker's first
        tick) always scans."""
        turn = conn.execute(
            query("claim_lease_check"), {"campaign_id": campaign_id, "every_s": lease / 4}
        ).fetchone()
        if campaign_id not in self._scanned:
            self._scanned.add(campaign_id)
            return True
        return turn is not None

    def reconcile(
        self, campaign_id: int, *, lease_s: float | None = None, wait: bool = False
    ) -> ReconcileResult:
        """One pass. Another reconciler busy with the campaign makes this a no-op, unless
        `wait` (resume: the rows must be produced again now, not at the next tick)."""
        lease = self.settings.lease_s if lease_s is None else lease_s
        with psycopg.connect(self.settings.pg_dsn, autocommit=True) as conn:
            if wait:
                conn.execute("SELECT pg_advisory_lock(%s, %s)", (0x5EC0, campaign_id))
                locked: tuple[Any, ...] | None = (True,)
            else:
                locked = conn.execute(
                    "SELECT pg_try_advisory_lock(%s, %s)", (0x5EC0, campaign_id)
                ).fetchone()
            if not locked or not locked[0]:
                return ReconcileResult(campaign_id, 0, 0, 0, False, skipped_locked=True)
            try:
                return self._reconcile(conn, campaign_id, lease)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s, %s)", (0x5EC0, campaign_id))

    def _reconcile(
        self, conn: psycopg.Connection[Any], campaign_id: int, lease: float
    ) -> ReconcileResult:
        params = {"campaign_id": campaign_id}
        row = conn.execute(
            "SELECT status, produced_at FROM campaigns WHERE id = %s", (campaign_id,)
        ).fetchone()
        if row is None:
            raise FlashsendError(f"campaign {campaign_id} does not exist")
        status, produced_at = row
        # Each step below scans the campaign's rows, so each runs only when the counters say
        # it has something to do.
        pending, sending, flagged, held = self._counts(conn, campaign_id)
        if status == "cancelled" and pending:
            # A lane may have released rows as pending just after the cancel ran.
            CampaignStore(conn).cancel_pending(campaign_id)  # retried on deadlock
        expired = 0
        if sending and self._expiry_due(conn, campaign_id, lease):
            expired = conn.execute(query("expire_leases"), {**params, "lease_s": lease}).rowcount
        requeued = orphans = 0
        winner: str | None = None
        hold_released = False
        if status == "sending" and produced_at is not None:
            now = self.clock()
            freed = release_hold(conn, campaign_id, now)
            if freed is not None and freed.freed:
                hold_released = True
                flagged += freed.released
            decided = decide(conn, campaign_id, now)
            if decided is not None and decided.won:
                winner = decided.variant
                flagged += decided.released
            elif held:
                flagged += release_due(conn, campaign_id, now)
            rows = conn.execute(query("take_requeue"), params).fetchall() if flagged else []
            if rows:
                try:
                    self.produce(campaign_id, rows)
                except FlashsendError:
                    conn.execute(query("restore_requeue"), {**params, "seqs": [r[0] for r in rows]})
                    raise
                requeued = len(rows)
            pending = self._counts(conn, campaign_id)[0]
            if pending and not requeued and self.consumed_everything(conn):
                orphan_rows = conn.execute(
                    "SELECT seq, user_id FROM campaign_recipients WHERE campaign_id = %s "
                    "AND status = 'pending' ORDER BY seq",
                    (campaign_id,),
                ).fetchall()
                self.produce(campaign_id, orphan_rows)
                orphans = len(orphan_rows)
        done = False
        if status == "sending" and produced_at is not None:
            pending, sending, _, held = self._counts(conn, campaign_id)
            if pending == 0 and sending == 0 and held == 0:
                done = (
                    conn.execute(
                        query("set_campaign_status"),
                        {
                            "id": campaign_id,
                            "status": "done",
                            "reason": None,
                            "from_statuses": ["sending"],
                        },
                    ).rowcount
                    > 0
                )
        return ReconcileResult(
            campaign_id,
            expired,
            requeued,
            orphans,
            done,
            winner=winner,
            hold_released=hold_released,
        )


def requeue_after_resume(
    settings: Settings, campaign_id: int, clock: Callable[[], datetime] = utc_now
) -> int:
    """After `resume`: produce doorbells again for the rows that lost theirs while the campaign
    was paused (consumed and flagged `requeue` by a claim, or released from a lane), and for
    any lost otherwise, and for a scheduled campaign's slots that came due meanwhile. Rows
    whose doorbell is still in Kafka simply get it consumed. Returns how many doorbells were
    produced."""
    with Reconciler(settings, clock) as reconciler:
        result = reconciler.reconcile(campaign_id, wait=True)
    return result.requeued + result.orphans
