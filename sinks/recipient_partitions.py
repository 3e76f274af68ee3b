"""One `campaign_recipients` partition per campaign (migration 0011).

The snapshot loads its campaign's rows into a table of its own before that table becomes a
partition: the rows go into a heap with no index, the two unique indexes are then built in
one sort each when the table is attached, and ANALYZE samples only this campaign's rows.
All of it runs inside the snapshot's transaction, so a failed snapshot leaves no table.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from flashsend.errors import UsageError

# Room on each page for the HOT copies of the two updates every row gets (pending -> sending
# -> sent): an update that stays on its page touches no index (seed trap 5).
FILLFACTOR = 70


def partition_of(campaign_id: int) -> sql.Identifier:
    return sql.Identifier(f"campaign_recipients_{int(campaign_id)}")


def create_detached(conn: psycopg.Connection, campaign_id: int) -> sql.Identifier:
    """A table shaped like campaign_recipients, not yet a partition, that only takes the
    campaign's rows. Its CHECK lets the attach skip the scan that proves the rows belong."""
    table = partition_of(campaign_id)
    conn.execute(
        sql.SQL(
            "CREATE TABLE {table} (LIKE campaign_recipients INCLUDING DEFAULTS, "
            "CHECK (campaign_id = {cid})) WITH (fillfactor = {ff})"
        ).format(table=table, cid=sql.Literal(int(campaign_id)), ff=sql.Literal(FILLFACTOR))
    )
    return table


def attach(conn: psycopg.Connection, campaign_id: int) -> None:
    """Make the table the campaign's partition; builds its primary key and unique index.
    Locks the parent in SHARE UPDATE EXCLUSIVE mode only: workers' reads and updates of
    other campaigns go on; another snapshot's attach waits for this transaction."""
    conn.execute(
        sql.SQL(
            "ALTER TABLE campaign_recipients ATTACH PARTITION {table} FOR VALUES IN ({cid})"
        ).format(table=partition_of(campaign_id), cid=sql.Literal(int(campaign_id)))
    )


def create_partition(conn: psycopg.Connection, campaign_id: int) -> None:
    """An empty partition for the campaign (rows then go in through the parent)."""
    create_detached(conn, campaign_id)
    attach(conn, campaign_id)


SETTLED = ("done", "cancelled", "failed")


def retire(conn: psycopg.Connection, campaign_id: int) -> str:
    """Drop a settled campaign's recipient rows by detaching and dropping its partition (seed
    trap 12: DELETE of 1M rows took 1.3 s and left as many dead tuples). The status counters
    stay, so `campaign status` still shows the final counts; `campaign report` needs the rows.

    DETACH … CONCURRENTLY takes only SHARE UPDATE EXCLUSIVE on the parent, so running
    campaigns' claims go on; it runs outside a transaction (`conn` must be in autocommit).
    Returns the dropped table's name. Raises UsageError when the campaign is not settled or
    has no partition of its own. Safe to run again after a crash at any point: a detach left
    pending is finalized, a detached table is dropped."""
    name, pending = retirable(conn, campaign_id)
    table = partition_of(campaign_id)
    if pending is not None:
        how = "FINALIZE" if pending else "CONCURRENTLY"  # FINALIZE: a detach cut short
        conn.execute(
            sql.SQL("ALTER TABLE campaign_recipients DETACH PARTITION {table} {how}").format(
                table=table, how=sql.SQL(how)
            )
        )
    conn.execute(sql.SQL("DROP TABLE {table}").format(table=table))
    return name


def retirable(conn: psycopg.Connection, campaign_id: int) -> tuple[str, bool | None]:
    """The campaign's table name and whether its detach is pending (None: already detached);
    UsageError when retire would refuse."""
    row = conn.execute("SELECT status FROM campaigns WHERE id = %s", (campaign_id,)).fetchone()
    if row is None:
        raise UsageError(f"campaign {campaign_id} does not exist")
    if row[0] not in SETTLED:
        raise UsageError(
            f"campaign {campaign_id} is {row[0]}: only a done, cancelled or failed campaign can "
            "be retired (cancel it first)"
        )
    name = f"campaign_recipients_{int(campaign_id)}"
    attached = conn.execute(
        "SELECT i.inhdetachpending FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'campaign_recipients'::regclass AND c.relname = %s",
        (name,),
    ).fetchone()
    detached = conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()
    if attached is None and (detached is None or detached[0] is None):
        raise UsageError(
            f"campaign {campaign_id} has no partition of its own: it was retired already, "
            "never started, or snapshotted before migration 0011 (its rows are in "
            "campaign_recipients_legacy)"
        )
    return name, None if attached is None else bool(attached[0])
