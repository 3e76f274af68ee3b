"""The A/B test's view of PostgreSQL (synchronous psycopg): variants at create, per-variant
counts, and the winner, one method per named statement (sinks/sql/variants.sql).

`set_winner` is the only decision: one statement guarded by `winner IS NULL`, so any number
of deciders (every worker's reconcile tick, `campaign promote`) can race and exactly one wins.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from flashsend.errors import NotFound, UsageError
from sinks.audit_store import Actor, record
from sinks.queries import query
from streams.rules.ab_test import Variant, VariantCounts

# Per-variant figures shown by status and report, in this order.
COUNTED = ("sent", "delivered", "bounced", "complained", "opened", "clicked")


@dataclass(frozen=True)
class AbState:
    campaign_id: int
    status: str
    variants: list[Variant]
    holdout_wait_s: float
    winner_by: str
    winner: str | None
    winner_at: datetime | None
    winner_reason: str | None
    snapshot_done_at: datetime | None  # the test share's start: snapshot, or a seed hold's end

    def template_of(self, name: str) -> str:
        return next(v.template for v in self.variants if v.name == name)


@dataclass(frozen=True)
class WinnerResult:
    variant: str  # the variant this call tried to make the winner
    won: bool  # this call set it (False: a winner was set already, or not allowed)
    released: int  # held rows made pending with the winner's template


class VariantStore:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def set_variants(
        self, campaign_id: int, variants: Sequence[Variant], holdout_wait_s: float, winner_by: str
    ) -> None:
        row = self.conn.execute(
            query("set_campaign_variants"),
            {
                "id": campaign_id,
                "variants": json.dumps([v.to_dict() for v in variants]),
                "holdout_wait_s": holdout_wait_s,
                "winner_by": winner_by,
            },
        ).fetchone()
        if row is None:
            raise UsageError(f"campaign {campaign_id} is not a draft: its variants are fixed")

    def state(self, campaign_id: int) -> AbState | None:
        """The campaign's A/B settings and winner; None when it has no variants."""
        row = self.conn.execute(query("ab_state"), {"id": campaign_id}).fetchone()
        if row is None:
            raise NotFound(f"campaign {campaign_id} does not exist")
        cid, status, variants, wait_s, winner_by, winner, winner_at, reason, snap = row
        if not variants:
            return None
        return AbState(
            int(cid),
            str(status),
            [Variant.of(v) for v in variants],
            float(wait_s or 0.0),
            str(winner_by or "manual"),
            winner,
            winner_at,
            reason,
            snap,
        )

    def counts(self, state: AbState) -> list[VariantCounts]:
        """Each variant's sent rows and counted events, in the declared order."""
        sent: dict[str, int] = {}
        for variant, status, n in self.conn.execute(
            query("variant_rows"), {"id": state.campaign_id}
        ).fetchall():
            if variant is not None and status == "sent":
                sent[variant] = sent.get(variant, 0) + int(n)
        events = {
            str(r[0]): r[1:]
            for r in self.conn.execute(
                query("variant_feedback"), {"id": state.campaign_id}
            ).fetchall()
        }
        out = []
        for v in state.variants:
            delivered, bounced, complained, opened, clicked = events.get(v.name, (0, 0, 0, 0, 0))
            out.append(
                VariantCounts(
                    v.name,
                    sent.get(v.name, 0),
                    int(delivered),
                    int(bounced),
                    int(complained),
                    int(opened),
                    int(clicked),
                )
            )
        return out

    def set_winner(
        self, campaign_id: int, variant: str, reason: str, actor: Actor | None = None
    ) -> WinnerResult:
        with self.conn.transaction():
            row = self.conn.execute(
                query("set_winner"), {"id": campaign_id, "variant": variant, "reason": reason}
            ).fetchone()
            assert row is not None
            if row[0]:
                record(
                    self.conn,
                    actor,
                    "promote",
                    campaign_id,
                    detail={"variant": variant, "released": int(row[1])},
                )
        return WinnerResult(variant, bool(row[0]), int(row[1]))


def variants_summary(store: VariantStore, campaign_id: int) -> dict[str, Any] | None:
    """What status and report show for an A/B campaign: per-variant counts and the winner."""
    state = store.state(campaign_id)
    if state is None:
        return None
    counts = store.counts(state)
    return {
        "winner": state.winner,
        "winner_by": state.winner_by,
        "winner_at": state.winner_at.isoformat() if state.winner_at else None,
        "winner_reason": state.winner_reason,
        "holdout_wait_s": state.holdout_wait_s,
        "variants": [
            {
                "name": v.name,
                "template": v.template,
                "percent": v.percent,
                **{k: getattr(c, k) for k in COUNTED},
            }
            for v, c in zip(state.variants, counts, strict=True)
        ],
    }
