"""Rows in doubt in PostgreSQL: settled by SES's events (the feedback agent, inside its batch
transaction) and queued again by an operator (`flashsend campaign resend-unknown`).

One function or method per named statement (sinks/sql/resolution.sql). The feedback agent's
function runs on the agent's own connection and transaction, so its effects commit with the
batch's offsets; psycopg errors there reach the agent's store, which turns them into
`StoreUnavailable` (retried). The CLI's store is synchronous.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg

from flashsend.errors import NotFound, UsageError
from sinks.audit_store import Actor, record
from sinks.pg_arrays import int_array, text_array
from sinks.queries import query
from streams.rules.resolution import EventProof, resend_refusal, settle

# Same key as reconcile's lock: a resend and a reconcile pass of one campaign never overlap.
RECONCILE_LOCK = 0x5EC0


@dataclass(frozen=True)
class Resolved:
    """Rows an event batch settled, by the status they had: (campaign, seq, was, now)."""

    rows: list[tuple[int, int, str, str]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def from_unknown(self) -> int:
        return sum(1 for _c, _s, was, _now in self.rows if was != "sending")


async def resolve_in_doubt(
    conn: psycopg.AsyncConnection[Any], proofs: Sequence[EventProof]
) -> Resolved:
    """Settle the rows these proofs name (at most one statement; none without proofs)."""
    settled = settle(proofs)
    if not settled:
        return Resolved()
    cur = await conn.execute(
        query("resolve_in_doubt"),
        {
            "campaign_ids": int_array(p.campaign_id for p in settled),
            "campaigns": int_array(sorted({p.campaign_id for p in settled})),
            "seqs": int_array(p.seq for p in settled),
            "emails": text_array(p.email for p in settled),
            "outcomes": text_array(p.outcome for p in settled),
            "message_ids": text_array(p.ses_message_id for p in settled),
            "at_ms": int_array(p.occurred_at_ms for p in settled),
        },
    )
    rows = await cur.fetchall()
    return Resolved([(int(c), int(s), str(was), str(now)) for c, s, was, now in rows])


@dataclass(frozen=True)
class UnknownRow:
    seq: int
    user_id: int
    email: str
    reason: str | None
    claimed_at: datetime | None


@dataclass(frozen=True)
class ResendPlan:
    campaign_id: int
    campaign_status: str
    older_than_s: float
    rows: list[UnknownRow]
    refusal: str | None  # why nothing may be resent now, or None


@dataclass(frozen=True)
class ResendDone:
    campaign_status: str  # before the resend
    moved: int
    reopened: bool
    audit_id: int


class UnknownRowsStore:
    """The operator's view: which unknown rows a resend would take, and the resend itself."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def plan(self, campaign_id: int, older_than_s: float) -> ResendPlan:
        row = self.conn.execute(
            "SELECT status, channel FROM campaigns WHERE id = %s", (campaign_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"campaign {campaign_id} does not exist")
        status, channel = str(row[0]), str(row[1])
        rows = [
            UnknownRow(int(s), int(u), str(e), r, c)
            for s, u, e, r, c in self.conn.execute(
                query("unknown_rows_to_resend"),
                {"campaign_id": campaign_id, "older_than_s": older_than_s},
            ).fetchall()
        ]
        return ResendPlan(campaign_id, status, older_than_s, rows, resend_refusal(status, channel))

    def resend(
        self,
        plan: ResendPlan,
        *,
        requested_by: str,
        host: str,
        reason: str,
        actor: Actor | None = None,
    ) -> ResendDone:
        """Move the plan's rows that are still unknown back to pending (flagged requeue) and
        audit it, in one transaction under the campaign's reconcile lock."""
        if plan.refusal is not None:
            raise UsageError(f"campaign {plan.campaign_id}: {plan.refusal}")
        with self.conn.transaction():
            self.conn.execute(
                "SELECT pg_advisory_xact_lock(%s, %s)", (RECONCILE_LOCK, plan.campaign_id)
            )
            row = self.conn.execute(
                query("resend_unknown"),
                {
                    "campaign_id": plan.campaign_id,
                    "seqs": int_array(r.seq for r in plan.rows),
                    "older_than_s": plan.older_than_s,
                    "requested_by": requested_by,
                    "host": host,
                    "reason": reason,
                },
            ).fetchone()
            assert row is not None
            status, moved, reopened, audit_id, _ = row
            if status is None:  # changed since the plan (cancelled, for one)
                now = self.conn.execute(
                    "SELECT status FROM campaigns WHERE id = %s", (plan.campaign_id,)
                ).fetchone()
                refusal = resend_refusal(str(now[0]) if now else "gone")
                raise UsageError(f"campaign {plan.campaign_id}: {refusal}")
            after = "sending" if reopened else str(status)
            record(
                self.conn,
                actor,
                "resend-unknown",
                plan.campaign_id,
                str(status),
                after,
                {"moved": int(moved), "unknown_resends_id": int(audit_id), "reason": reason},
            )
        return ResendDone(str(status), int(moved), bool(reopened), int(audit_id))

    def resends(self, campaign_id: int) -> int:
        """Rows of this campaign queued again by resend-unknown, over all its runs."""
        row = self.conn.execute(
            query("resends_of_campaign"), {"campaign_id": campaign_id}
        ).fetchone()
        return int(row[0]) if row else 0
