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
from sinks.audit_store import Actor, record
from sinks.campaign_store import SETTLED, CampaignStore

# Room on each page for the HOT copies of the two updates every row gets (pending -> sending
# -> sent): an update that stays on its page touches no index (seed trap 5).
FILLFACTOR = 70


def partition_name(campaign_id: int) -> str:
    return f"campaign_recipients_{int(campaign_id)}"


def partition_of(campaign_id: int) -> sql.Identifier:
    return sql.Identifier(partition_name(campaign_id))


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


# The counter trigger (migration 0010) for statements that name the partition itself (the
# workers' claim and record_results, migration 0013); the parent's fires only for statements
# that name the parent.
DIRECT_TRIGGER = "campaign_counts_update_direct"


def attach(conn: psycopg.Connection, campaign_id: int) -> None:
    """Make the table the campaign's partition; builds its primary key and unique index, and
    gives it the counter trigger for updates that name it. Locks the parent in SHARE UPDATE
    EXCLUSIVE mode only: workers' reads and updates of other campaigns go on; another
    snapshot's attach waits for this transaction."""
    conn.execute(
        sql.SQL(
            "CREATE TRIGGER {trigger} AFTER UPDATE ON {table} "
            "REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows "
            "FOR EACH STATEMENT EXECUTE FUNCTION campaign_counts_on_update()"
        ).format(trigger=sql.Identifier(DIRECT_TRIGGER), table=partition_of(campaign_id))
    )
    conn.execute(
        sql.SQL(
            "ALTER TABLE campaign_recipients ATTACH PARTITION {table} FOR VALUES IN ({cid})"
        ).format(table=partition_of(campaign_id), cid=sql.Literal(int(campaign_id)))
    )


def create_partition(conn: psycopg.Connection, campaign_id: int) -> None:
    """An empty partition for the campaign (rows then go in through the parent)."""
    create_detached(conn, campaign_id)
    attach(conn, campaign_id)


def retire(conn: psycopg.Connection, campaign_id: int, actor: Actor | None = None) -> str:
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
    with conn.transaction():
        status = CampaignStore(conn).status(campaign_id)
        conn.execute(sql.SQL("DROP TABLE {table}").format(table=table))
        record(conn, actor, "retire", campaign_id, status, status, {"dropped": name})
    return name


def retirable(conn: psycopg.Connection, campaign_id: int) -> tuple[str, bool | None]:
    """The campaign's table name and whether its detach is pending (None: already detached);
    UsageError when retire would refuse."""
    status = CampaignStore(conn).status(campaign_id)  # NotFound for an unknown id
    if status not in SETTLED:
        raise UsageError(
            f"campaign {campaign_id} is {status}: only a done, cancelled or failed campaign can "
            "be retired (cancel it first)"
        )
    name = partition_name(campaign_id)
    row = conn.execute(
        "SELECT t.oid IS NOT NULL, i.inhdetachpending"
        "  FROM (SELECT to_regclass(%s) AS oid) t LEFT JOIN pg_inherits i ON i.inhrelid = t.oid",
        (name,),
    ).fetchone()
    if row is None or not row[0]:
        raise UsageError(
            f"campaign {campaign_id} has no partition of its own: it was retired already, "
            "never started, or snapshotted before migration 0011 (its rows are in "
            "campaign_recipients_legacy)"
        )
    return name, row[1]
