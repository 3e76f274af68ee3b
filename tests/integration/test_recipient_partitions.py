"""campaign_recipients partitioned by campaign (migration 0011, sinks/recipient_partitions)."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import psycopg
import pytest

from flashsend.errors import UsageError
from flashsend.settings import Settings
from infra.migrate import MIGRATIONS_DIR, apply_migrations
from producers.campaign import snapshot
from sinks.campaign_store import CampaignStore
from sinks.queries import query
from sinks.recipient_partitions import retire
from sinks.users import seed_users
from tests.conftest import LocalStack
from tests.integration.campaign_helpers import new_campaign
from tests.integration.ops_helpers import cli

COUNTS = """SELECT status, sum(n)::int FROM campaign_status_counts WHERE campaign_id = %s
             GROUP BY status HAVING sum(n) <> 0 ORDER BY status"""
ROWS = """SELECT status, count(*)::int FROM campaign_recipients WHERE campaign_id = %s
           GROUP BY status ORDER BY status"""


def test_a_snapshot_gets_its_own_analysed_indexed_partition_and_its_counters(
    settings: Settings,
) -> None:
    seed_users(settings.pg_dsn, 3_000)
    cid = new_campaign(settings)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        count = snapshot(conn, cid, settings.audience_condition)
        part = conn.execute(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid), c.reltuples, c.reloptions "
            "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'campaign_recipients'::regclass"
        ).fetchall()
        assert part == [
            (f"campaign_recipients_{cid}", f"FOR VALUES IN ('{cid}')", count, ["fillfactor=70"])
        ]  # reltuples = rows: ANALYZE ran on it
        rows = conn.execute(ROWS, (cid,)).fetchall()
        assert conn.execute(COUNTS, (cid,)).fetchall() == rows
        assert sum(n for _, n in rows) == count > 2_000
        with pytest.raises(psycopg.errors.UniqueViolation):  # the primary key came with it
            conn.execute(
                "INSERT INTO campaign_recipients (campaign_id, seq, user_id, email) "
                "VALUES (%s, 1, -1, 'x@y.test')",
                (cid,),
            )
        with pytest.raises(psycopg.errors.CheckViolation):  # no partition, no rows
            conn.execute(
                "INSERT INTO campaign_recipients (campaign_id, seq, user_id, email) "
                "VALUES (%s, 1, 1, 'x@y.test')",
                (cid + 1,),
            )


def test_the_snapshot_skips_bad_and_suppressed_addresses_whatever_their_spelling(
    settings: Settings,
) -> None:
    """users.email_ok and users.email_key (migration 0012) are computed by PostgreSQL when a
    user row is written, and follow every later change of its address."""
    users = {
        1: "plain@mail.flashsend.test",
        2: "  Jane.Doe@Example.COM ",  # suppressed as jane.doe@example.com
        3: "space in@mail.flashsend.test",
        4: "two@@at.example",
        5: "",
        6: "x" * 65 + "@mail.flashsend.test",  # local part longer than 64
        7: "moved@mail.flashsend.test",  # complained, then changed address
    }
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO users (id, email) VALUES (%s, %s)", sorted(users.items()))
        conn.execute(
            "INSERT INTO email_suppressions (email, reason) VALUES "
            "('jane.doe@example.com', 'complaint'), ('moved@mail.flashsend.test', 'complaint')"
        )
        conn.execute("UPDATE users SET email = 'Moved.Again@Mail.flashsend.test' WHERE id = 7")
        cid = new_campaign(settings)
        snapshot(conn, cid, settings.audience_condition)
        rows = conn.execute(
            "SELECT user_id, status, reason FROM campaign_recipients WHERE campaign_id = %s "
            "ORDER BY seq",
            (cid,),
        ).fetchall()
    assert rows == [
        (1, "pending", None),
        (3, "skipped", "invalid_email"),
        (4, "skipped", "invalid_email"),
        (5, "skipped", "invalid_email"),
        (6, "skipped", "invalid_email"),
        (7, "pending", None),
    ]


def test_a_snapshot_in_progress_does_not_block_another_campaigns_claims(
    settings: Settings,
) -> None:
    """The snapshot's DDL (create, attach) runs in its transaction beside a running
    campaign's claims: the claim must not wait for it (lock_timeout 3 s)."""
    seed_users(settings.pg_dsn, 2_000)
    running, starting = new_campaign(settings), new_campaign(settings)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        snapshot(conn, running, settings.audience_condition)
    with (
        psycopg.connect(settings.pg_dsn) as snapshotter,
        psycopg.connect(settings.pg_dsn) as worker,
    ):
        snapshot(snapshotter, starting, settings.audience_condition)  # not committed yet
        worker.execute("SET lock_timeout = '3s'")
        claimed = worker.execute(
            query("claim_batch"),
            {"campaign_ids": [running] * 3, "campaigns": [running], "seqs": [1, 2, 3]},
        ).fetchall()
        worker.commit()
        assert len(claimed) == 3
        snapshotter.commit()
    with psycopg.connect(settings.pg_dsn) as conn:
        assert conn.execute(ROWS, (starting,)).fetchall()


def test_rows_snapshotted_before_the_migration_stay_readable_and_counted(
    stack: LocalStack, tmp_path: Path
) -> None:
    before = tmp_path / "before_0011"
    before.mkdir()
    for path in sorted(MIGRATIONS_DIR.glob("*.sql")):
        if int(path.name[:4]) < 11:
            shutil.copy(path, before / path.name)
    database = f"m_{uuid.uuid4().hex[:8]}"
    stack.postgres.create_database(database)
    dsn = stack.settings.pg_dsn_for(database)
    apply_migrations(dsn, before)
    with psycopg.connect(dsn, autocommit=True) as conn:
        for cid in (7, 9):
            conn.execute(
                "INSERT INTO campaigns (id, name, template, from_address, rate_limit, "
                "audience_condition, status) VALUES (%s, 'old', 't', 'a@b.test', 0, 'true', "
                "'sending')",
                (cid,),
            )
            conn.execute(
                "INSERT INTO campaign_recipients (campaign_id, seq, user_id, email) "
                "SELECT %s, g, g, 'u' || g || '@x.test' FROM generate_series(1, 50) g",
                (cid,),
            )
    assert next(m.version for m in apply_migrations(dsn)) == 11  # and any later ones
    with psycopg.connect(dsn, autocommit=True) as conn:
        bound = conn.execute(
            "SELECT pg_get_expr(relpartbound, oid) FROM pg_class "
            "WHERE relname = 'campaign_recipients_legacy'"
        ).fetchone()
        assert bound == ("FOR VALUES IN ('7', '9')",)
        conn.execute(
            "UPDATE campaign_recipients SET status = 'sent' WHERE campaign_id = 9 AND seq <= 10"
        )
        assert conn.execute(ROWS, (9,)).fetchall() == [("pending", 40), ("sent", 10)]
        assert conn.execute(COUNTS, (9,)).fetchall() == [("pending", 40), ("sent", 10)]


def test_retiring_a_settled_campaign_drops_its_partition_and_keeps_its_counts(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seed_users(settings.pg_dsn, 2_000)
    cid = new_campaign(settings)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        count = snapshot(conn, cid, settings.audience_condition)
        with pytest.raises(UsageError, match="is sending"):
            retire(conn, cid)
        CampaignStore(conn).transition(cid, "cancelled", "test")
    code, out = cli(settings, monkeypatch, capsys, "campaign", "retire", str(cid))
    assert code == 0 and "add --yes" in out and f"{count:,} recipient row(s)" in out
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        assert conn.execute(ROWS, (cid,)).fetchall()  # nothing dropped without --yes
    code, out = cli(settings, monkeypatch, capsys, "campaign", "retire", str(cid), "--yes")
    assert code == 0 and f"campaign_recipients_{cid}" in out
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        assert conn.execute(
            "SELECT to_regclass(%s)", (f"campaign_recipients_{cid}",)
        ).fetchone() == (None,)
        assert conn.execute(ROWS, (cid,)).fetchall() == []
        assert CampaignStore(conn).progress(cid).total == count  # the counters stay
        with pytest.raises(UsageError, match="retired already"):
            retire(conn, cid)


def test_a_retire_cut_short_finishes_when_run_again(settings: Settings) -> None:
    """Killed in the middle of DETACH … CONCURRENTLY (detach left pending) or between detach
    and drop: running retire again completes it."""
    seed_users(settings.pg_dsn, 500)
    pending, detached = new_campaign(settings), new_campaign(settings)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        for cid in (pending, detached):
            snapshot(conn, cid, settings.audience_condition)
            CampaignStore(conn).transition(cid, "cancelled", "test")
        with psycopg.connect(settings.pg_dsn) as reader:
            reader.execute("SELECT count(*) FROM campaign_recipients").fetchone()  # holds on
            conn.execute("SET statement_timeout = '1s'")
            with pytest.raises(psycopg.errors.QueryCanceled):  # waits for the reader, cut short
                conn.execute(
                    f"ALTER TABLE campaign_recipients DETACH PARTITION "
                    f"campaign_recipients_{pending} CONCURRENTLY"
                )
            conn.execute("RESET statement_timeout")
        left = conn.execute(
            "SELECT inhdetachpending FROM pg_inherits WHERE inhrelid = %s::regclass",
            (f"campaign_recipients_{pending}",),
        ).fetchone()
        assert left == (True,)
        conn.execute(
            f"ALTER TABLE campaign_recipients DETACH PARTITION campaign_recipients_{detached}"
        )
        for cid in (pending, detached):
            assert retire(conn, cid) == f"campaign_recipients_{cid}"
            gone = conn.execute("SELECT to_regclass(%s)", (f"campaign_recipients_{cid}",))
            assert gone.fetchone() == (None,)
