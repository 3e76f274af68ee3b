"""Helpers for campaign integration tests: seed, create, start, run workers, wait."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from flashsend.lab.feedback_run import wait_for
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from infra.ses_standin.admin import SesStandinAdmin
from producers.campaign import snapshot
from producers.campaign_ops import (
    DEFAULT_HTML,
    DEFAULT_SUBJECT,
    DEFAULT_TEMPLATE,
    DEFAULT_TEXT,
    create_campaign,
)
from schemas.doorbell import DOORBELL_BLOCK, DoorbellWriter
from schemas.serde import AvroCodec, registry_client
from sinks.campaign_store import CampaignStore, Progress
from sinks.ses import SesSender, make_client
from sinks.users import seed_users


def admin(settings: Settings) -> SesStandinAdmin:
    assert settings.ses_endpoint_url
    return SesStandinAdmin(settings.ses_endpoint_url)


def put_template(settings: Settings) -> None:
    SesSender(make_client(settings, timeout=10)).put_template(
        DEFAULT_TEMPLATE, DEFAULT_SUBJECT, DEFAULT_HTML, DEFAULT_TEXT
    )


def new_campaign(settings: Settings, *, rate: float = 0.0, name: str = "t") -> int:
    put_template(settings)
    return create_campaign(settings, name=name, rate=rate)


def progress(settings: Settings, campaign_id: int) -> Progress:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return CampaignStore(conn).progress(campaign_id)


def wait_finished(
    settings: Settings, campaign_id: int, pool: WorkerPool | None = None, timeout: float = 120.0
) -> Progress:
    deadline = time.monotonic() + timeout
    while True:
        p = progress(settings, campaign_id)
        if p.finished:
            return p
        if pool is not None and not pool.alive():
            raise AssertionError(f"workers died; logs in {pool.log_dir}")
        if time.monotonic() > deadline:
            raise AssertionError(f"campaign {campaign_id} not finished: {p.as_dict()}")
        time.sleep(0.3)


# Counted by scanning the rows and, in the same statement (one snapshot), read from the
# trigger-kept counters that `campaign status` and reconcile use (migration 0010).
_SCAN_AND_COUNTERS = """
WITH scan AS (
    SELECT status, count(*) AS n FROM campaign_recipients WHERE campaign_id = %(id)s
     GROUP BY status
    UNION ALL
    SELECT 'requeue', count(*) FROM campaign_recipients WHERE campaign_id = %(id)s AND requeue
), kept AS (
    SELECT status, sum(n)::bigint AS n FROM campaign_status_counts WHERE campaign_id = %(id)s
     GROUP BY status
)
SELECT status, coalesce(scan.n, 0), coalesce(kept.n, 0) FROM scan FULL JOIN kept USING (status)
"""


def statuses(settings: Settings, campaign_id: int) -> dict[str, int]:
    """Recipients per status; also checks that the counters agree with the rows."""
    with psycopg.connect(settings.pg_dsn) as conn:
        rows = conn.execute(_SCAN_AND_COUNTERS, {"id": campaign_id}).fetchall()
    scanned = {str(s): int(n) for s, n, _ in rows if n}
    kept = {str(s): int(k) for s, _, k in rows if k}
    assert kept == scanned, f"counters {kept} disagree with the rows {scanned}"
    scanned.pop("requeue", None)
    return scanned


def settled(settings: Settings, campaign_id: int, timeout: float = 90) -> dict[str, int]:
    """Counts per status once nothing is pending or sending (held rows may wait on)."""

    def done() -> dict[str, int] | None:
        counts = statuses(settings, campaign_id)
        return None if counts.get("pending") or counts.get("sending") else counts

    result: dict[str, int] = wait_for("pending and sending drained", done, timeout, 0.2)
    return result


def reconcile_at(settings: Settings, campaign_id: int, now: datetime) -> None:
    """One reconcile pass whose clock reads `now` (what releases holds, winners and slots)."""
    from producers.reconcile import Reconciler

    with Reconciler(settings, clock=lambda: now) as reconciler:
        reconciler.reconcile(campaign_id, wait=True)


def stats(settings: Settings, campaign_id: int) -> dict[str, Any]:
    return dict(admin(settings).stats(campaign=str(campaign_id)))


PENDING_SEQS = "SELECT seq FROM campaign_recipients WHERE campaign_id = %s AND status = 'pending'"


def pending_seqs(settings: Settings, campaign_id: int) -> list[int]:
    with psycopg.connect(settings.pg_dsn) as conn:
        return [r[0] for r in conn.execute(PENDING_SEQS, (campaign_id,))]


def claim_twice_at_once(
    settings: Settings, statement: str, params: dict[str, Any]
) -> list[set[int]]:
    """Run a claim statement on two connections released together; the seqs each claimed
    (rows returned with status 'sending')."""
    barrier = threading.Barrier(2)
    claimed: list[set[int]] = []

    def claimer() -> None:
        with psycopg.connect(settings.pg_dsn) as conn:
            barrier.wait()
            rows = conn.execute(statement, params).fetchall()
            conn.commit()
            claimed.append({r[1] for r in rows if r[5] == "sending"})

    threads = [threading.Thread(target=claimer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return claimed


@dataclass(frozen=True)
class Consumed:
    """A consumed Kafka record, as Faust hands it to an agent (the campaign sender's
    `handle`, the mail and feedback ingests)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()


def consumed_records(
    settings: Settings,
    campaign_id: int,
    partition: int,
    rows: list[tuple[int, int]],
    block: int = DOORBELL_BLOCK,
) -> list[Consumed]:
    """What Faust would deliver for these (seq, user_id) rows, `block` to a doorbell, at
    offsets 0, 1, 2, …"""
    codec = AvroCodec(registry_client(settings.schema_registry_url), "campaign_recipient")
    writer = DoorbellWriter(codec, campaign_id, 0)
    blocks = [rows[i : i + block] for i in range(0, len(rows), block)]
    return [
        Consumed(
            settings.topic_recipients, partition, offset, str(b[0][1]).encode(), writer.encode(b)
        )
        for offset, b in enumerate(blocks)
    ]


def sending_campaign(settings: Settings, users: int = 400) -> int:
    """A campaign snapshotted and `sending`, with no doorbell produced."""
    seed_users(settings.pg_dsn, users)
    cid = new_campaign(settings)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        snapshot(conn, cid, settings.audience_condition)
    return cid


def sql(settings: Settings, text: str, *args: Any) -> list[tuple[Any, ...]]:
    """Run one statement; its rows (none for a statement without a result)."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        cur = conn.execute(text, args)
        return cur.fetchall() if cur.description else []


def recipient_rows(settings: Settings, cid: int) -> dict[int, tuple[Any, ...]]:
    """seq → (status, reason, message_id, address) of the campaign's rows."""
    found = sql(
        settings,
        "SELECT seq, status, reason, message_id, email FROM campaign_recipients "
        "WHERE campaign_id = %s",
        cid,
    )
    return {int(r[0]): tuple(r[1:]) for r in found}
