"""Deciding an A/B test automatically once the holdout wait is over: every worker's reconcile
tick calls `decide`. By hand, `flashsend campaign promote ID VARIANT` (producers.campaign_ops
.promote) decides at any time. Both end in the one guarded statement `set_winner`
(sinks/sql/variants.sql), so deciders may race or repeat: exactly one sets the winner and
releases the holdout; the others change nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from sinks.variant_store import VariantStore, WinnerResult
from streams.rules.ab_test import choose_winner, winner_due


def decide(conn: psycopg.Connection[Any], campaign_id: int, now: datetime) -> WinnerResult | None:
    """Set the automatic winner when it is due; None when there is nothing to decide (no
    variants, a winner already, manual choice, not sending, the wait not over)."""
    store = VariantStore(conn)
    state = store.state(campaign_id)
    if state is None or state.winner is not None or state.winner_by == "manual":
        return None
    if state.status != "sending" or not winner_due(
        state.snapshot_done_at, state.holdout_wait_s, now
    ):
        return None
    name, why = choose_winner(store.counts(state), state.winner_by)
    return store.set_winner(campaign_id, name, why)
