"""The audit log (migration 0030): who changed what, in the transaction of the change.

Every state-changing API request and command line command passes an `Actor`; the store that
makes the change writes its row before that transaction commits, so a change without its row
(or a row without its change) cannot exist. The table is append-only (a trigger refuses
UPDATE, DELETE and TRUNCATE).
"""

from __future__ import annotations

import getpass
import json
import socket
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from sinks.queries import query


@dataclass(frozen=True)
class Actor:
    """Who asks for a change: an API key's name with the request's id and the client's
    address, or `cli:<os user>` with the host."""

    who: str
    request_id: str | None = None
    source: str | None = None

    @classmethod
    def cli(cls, operator: str = "") -> Actor:
        return cls(f"cli:{operator or getpass.getuser()}", None, socket.gethostname())


def record(
    conn: psycopg.Connection[Any],
    actor: Actor | None,
    action: str,
    campaign_id: int | None,
    before: str | None = None,
    after: str | None = None,
    detail: dict[str, Any] | None = None,
) -> int | None:
    """One audit row on `conn`, inside the caller's transaction; nothing without an actor
    (the pipeline's own changes, such as an automatic pause, are not an operator's)."""
    if actor is None:
        return None
    row = conn.execute(
        query("insert_audit"),
        {
            "actor": actor.who,
            "action": action,
            "campaign_id": campaign_id,
            "state_before": before,
            "state_after": after,
            "request_id": actor.request_id,
            "source": actor.source,
            "detail": None if detail is None else json.dumps(detail, default=str),
        },
    ).fetchone()
    return None if row is None else int(row[0])


def read_audit(
    conn: psycopg.Connection[Any],
    *,
    campaign_id: int | None = None,
    before_id: int | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Audit rows, newest first."""
    cur = conn.cursor(row_factory=dict_row)
    cur.execute(
        query("list_audit"), {"campaign_id": campaign_id, "before_id": before_id, "limit": limit}
    )
    return [
        {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}
        for row in cur.fetchall()
    ]
