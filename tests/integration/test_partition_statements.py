"""The claim and the results name the campaign's own partition (migration 0013,
sinks/recipient_store): counters stay true, races are still decided by the row, and campaigns
without such a partition go through the parent."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from flashsend.settings import Settings
from sinks.campaign_store import CampaignStore
from sinks.offsets import Assignment, PartitionSpan, StoreUnavailable
from sinks.queries import query
from sinks.recipient_partitions import DIRECT_TRIGGER, partition_of, retire
from sinks.recipient_store import RecipientStore, RowResult
from tests.integration.campaign_helpers import (
    claim_twice_at_once,
    pending_seqs,
    sending_campaign,
)
from tests.integration.mail_fixtures import open_pool, run

COUNTS = """SELECT status, sum(n)::int FROM campaign_status_counts WHERE campaign_id = %s
             GROUP BY status HAVING sum(n) <> 0 ORDER BY status"""
ROWS = """SELECT status, count(*)::int FROM campaign_recipients WHERE campaign_id = %s
           GROUP BY status ORDER BY status"""
GROUP = "partition-statements"


def counts_and_rows(settings: Settings, cid: int) -> tuple[list[Any], list[Any]]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return conn.execute(COUNTS, (cid,)).fetchall(), conn.execute(ROWS, (cid,)).fetchall()


def reset_statement_stats(settings: Settings) -> None:
    """pg_stat_statements is preloaded by the stack (infra/postgres.py); its view needs the
    extension in this test's database."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute("SELECT pg_stat_statements_reset()")


def executed(settings: Settings, cid: int) -> dict[str, int]:
    """Calls of the partition and the parent statements since the last reset."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT query, calls FROM pg_stat_statements WHERE query LIKE %s AND dbid = "
            "(SELECT oid FROM pg_database WHERE datname = current_database())",
            ("%UPDATE %campaign_recipients%",),
        ).fetchall()
    table = f'"campaign_recipients_{cid}"'
    return {
        "partition": sum(n for q, n in rows if table in q),
        "parent": sum(n for q, n in rows if "UPDATE campaign_recipients r" in q),
    }


async def claim_and_record(settings: Settings, cid: int, seqs: list[int], offset: int) -> int:
    pool = await open_pool(settings, size=2)
    try:
        store = RecipientStore(pool, group_id=GROUP, topic=f"t{cid}")
        await store.offsets.take(Assignment.of(store.topic, [0]))
        outcome = await store.claim_batch(
            [PartitionSpan(0, offset, offset)], {0: [(offset, (cid, seq)) for seq in seqs]}
        )
        sent = [RowResult(r.seq, "sent", None, f"m{r.seq}") for r in outcome.claimed[::2]]
        failed = [RowResult(r.seq, "failed", "x", None) for r in outcome.claimed[1::2]]
        order = outcome.claimed[::2] + outcome.claimed[1::2]
        await store.record_results(cid, sent + failed, [r.attempt for r in order])
        return len(outcome.claimed)
    finally:
        await pool.close()


def test_a_new_partition_carries_the_counter_trigger_and_the_workers_name_it(
    settings: Settings,
) -> None:
    cid = sending_campaign(settings)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        own = conn.execute(
            query("own_partition"),
            {"name": f"campaign_recipients_{cid}", "trigger": DIRECT_TRIGGER},
        ).fetchone()
        assert own == (True,)
    reset_statement_stats(settings)
    assert run(claim_and_record(settings, cid, list(range(1, 101)), 0)) == 100
    assert executed(settings, cid) == {"partition": 2, "parent": 0}
    counts, rows = counts_and_rows(settings, cid)
    assert counts == rows
    assert dict(rows)["sent"] == 50 and dict(rows)["failed"] == 50


def test_a_partition_without_the_trigger_is_updated_through_the_parent(
    settings: Settings,
) -> None:
    """A database whose partitions predate migration 0013's trigger (or any table without
    it): naming the partition would skip the counters, so the workers do not."""
    cid = sending_campaign(settings)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP TRIGGER {t} ON {p}").format(
                t=sql.Identifier(DIRECT_TRIGGER), p=partition_of(cid)
            )
        )
    reset_statement_stats(settings)
    assert run(claim_and_record(settings, cid, list(range(1, 41)), 0)) == 40
    assert executed(settings, cid) == {"partition": 0, "parent": 2}
    counts, rows = counts_and_rows(settings, cid)
    assert counts == rows and dict(rows)["sent"] == 20


def test_two_claimers_racing_through_the_partition_never_claim_a_row_twice(
    settings: Settings,
) -> None:
    cid = sending_campaign(settings, 2_000)
    seqs = pending_seqs(settings, cid)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        statement = (
            sql.SQL(query("claim_in_partition")).format(partition=partition_of(cid)).as_string(conn)
        )
    a, b = claim_twice_at_once(settings, statement, {"campaign_id": cid, "seqs": seqs})
    assert not (a & b), "a row was claimed twice"
    assert len(a | b) == len(seqs)
    counts, rows = counts_and_rows(settings, cid)
    assert counts == rows


def test_results_of_a_campaign_retired_meanwhile_fail_once_then_go_through_the_parent(
    settings: Settings,
) -> None:
    cid = sending_campaign(settings)

    async def scenario() -> tuple[str, int]:
        pool = await open_pool(settings, size=2)
        try:
            store = RecipientStore(pool, group_id=GROUP, topic=f"t{cid}")
            await store.offsets.take(Assignment.of(store.topic, [0]))
            claim = await store.claim_batch(
                [PartitionSpan(0, 0, 0)], {0: [(0, (cid, 1)), (0, (cid, 2))]}
            )
            with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
                CampaignStore(conn).transition(cid, "cancelled", "test")
                retire(conn, cid)
            results = [RowResult(r.seq, "sent", None, "m") for r in claim.claimed]
            attempts = [r.attempt for r in claim.claimed]
            with pytest.raises(StoreUnavailable) as first:
                await store.record_results(cid, results, attempts)
            await store.record_results(cid, results, attempts)  # the retry: nothing to update
            return str(first.value), len(claim.claimed)
        finally:
            await pool.close()

    message, claimed = run(scenario())
    assert claimed == 2
    assert f"campaign_recipients_{cid}" in message and "does not exist" in message
