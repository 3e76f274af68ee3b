"""The suppression list for admins (sinks/sql/suppressions.sql): list, look up, add and remove
an address, each change with its audit row in the same transaction. Addresses are kept
normalised (streams.rules.addresses.normalise_email), as the sender and the feedback agent key them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row

from flashsend.errors import Conflict, NotFound
from sinks.audit_store import Actor, record
from sinks.queries import query
from streams.rules.addresses import normalise_email


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in row.items()}


class SuppressionStore:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def find(
        self, *, address: str | None = None, after: str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        cur = self.conn.cursor(row_factory=dict_row)
        params = {
            "address": None if address is None else normalise_email(address),
            "after": after,
            "limit": limit,
        }
        return [_plain(r) for r in cur.execute(query("list_suppressions"), params).fetchall()]

    def add(self, address: str, reason: str, actor: Actor) -> dict[str, Any]:
        email = normalise_email(address)
        with self.conn.transaction():
            cur = self.conn.cursor(row_factory=dict_row)
            params = {"address": email, "reason": reason, "source": f"manual:{actor.who}"}
            row = cur.execute(query("add_suppression"), params).fetchone()
            if row is None:
                there = self.find(address=email, limit=1)
                reason_there = there[0]["reason"] if there else "?"
                raise Conflict(
                    f"{email} is suppressed already ({reason_there})", state="suppressed"
                )
            record(
                self.conn,
                actor,
                "suppression add",
                None,
                None,
                "suppressed",
                {"address": email, "reason": reason},
            )
        return _plain(row)

    def remove(self, address: str, reason: str, actor: Actor) -> dict[str, Any]:
        email = normalise_email(address)
        with self.conn.transaction():
            cur = self.conn.cursor(row_factory=dict_row)
            row = cur.execute(query("remove_suppression"), {"address": email}).fetchone()
            if row is None:
                raise NotFound(f"{email} is not suppressed")
            record(
                self.conn,
                actor,
                "suppression remove",
                None,
                "suppressed",
                None,
                {"address": email, "reason": reason, "was": row["reason"]},
            )
        return _plain(row)
