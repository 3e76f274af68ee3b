"""One `campaign_recipients` partition per campaign (migration 0011).

The snapshot loads its campaign's rows into a table of its own before that table becomes a
partition: the rows go into a heap with no index, the two unique indexes are then built in
one sort each when the table is attached, and ANALYZE samples only this campaign's rows.
All of it runs inside the snapshot's transaction, so a failed snapshot leaves no table.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

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
