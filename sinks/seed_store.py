"""A seed list's view of PostgreSQL (synchronous psycopg): seed rows and the hold at snapshot,
the hold's state, its release, one method per named statement (sinks/sql/seeds.sql).

`release` is the only decision: one statement guarded by `hold_released_at IS NULL`, so every
worker's reconcile tick and `campaign release` may race and exactly one releases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from flashsend.errors import NotFound
from sinks.audit_store import Actor, record
from sinks.queries import query
from streams.rules.seed_list import HoldState


@dataclass(frozen=True)
class SeedPlan:
    """What `campaign start --seed-list FILE --hold D` adds to the snapshot."""

    emails: list[str]  # normalised, each once (streams.rules.seed_list.parse_seed_list)
    hold_s: float


@dataclass(frozen=True)
class ReleaseResult:
    freed: bool  # this call ended the hold (False: released already, or not allowed)
    released: int  # held rows made pending


class SeedStore:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def add_to_snapshot(
        self, table: sql.Composable, campaign_id: int, audience: int, plan: SeedPlan
    ) -> None:
        """In the snapshot's transaction, before the partition is counted and attached: the
        seed rows after the audience's `audience` rows, their addresses taken out of the
        audience, and the hold on the campaign row."""
        args = {"campaign_id": campaign_id, "emails": plan.emails}
        self.conn.execute(sql.SQL(query("skip_seed_addresses")).format(partition=table), args)
        self.conn.execute(
            sql.SQL(query("insert_seeds")).format(partition=table), {**args, "after_seq": audience}
        )
        self.conn.execute(
            query("set_hold"), {"id": campaign_id, "seeds": len(plan.emails), "hold_s": plan.hold_s}
        )

    def start_hold(self, campaign_id: int) -> None:
        """The seeds are produced: the hold counts from now (no-op without a hold)."""
        self.conn.execute(query("start_hold"), {"id": campaign_id})

    def state(self, campaign_id: int) -> HoldState:
        row = self.conn.execute(query("hold_state"), {"id": campaign_id}).fetchone()
        if row is None:
            raise NotFound(f"campaign {campaign_id} does not exist")
        cid, status, seeds, until, released_at, released_by = row
        return HoldState(int(cid), str(status), int(seeds or 0), until, released_at, released_by)

    def seeds(self, campaign_id: int) -> list[dict[str, Any]]:
        return [
            {"email": e, "status": s, "reason": r, "sent_at": t.isoformat() if t else None}
            for e, s, r, t in self.conn.execute(query("seed_rows"), {"id": campaign_id})
        ]

    def release(self, campaign_id: int, by: str, actor: Actor | None = None) -> ReleaseResult:
        with self.conn.transaction():
            row = self.conn.execute(query("release_hold"), {"id": campaign_id, "by": by}).fetchone()
            assert row is not None
            if row[0]:
                record(self.conn, actor, "release", campaign_id, detail={"released": int(row[1])})
        return ReleaseResult(bool(row[0]), int(row[1]))


def hold_summary(store: SeedStore, campaign_id: int) -> dict[str, Any] | None:
    """What status and report show for a campaign started with a seed list (None without)."""
    state = store.state(campaign_id)
    if not state.seed_recipients and state.hold_until is None:
        return None
    rows = store.seeds(campaign_id)
    return {
        "seed_recipients": state.seed_recipients,
        "seed_by_status": seed_counts(rows),
        "seeds": rows,
        "hold_until": state.hold_until.isoformat() if state.hold_until else None,
        "holding": state.holding,
        "released_at": state.released_at.isoformat() if state.released_at else None,
        "released_by": state.released_by,
    }


def seed_counts(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rows:
        out[r["status"]] = out.get(r["status"], 0) + 1
    return out
