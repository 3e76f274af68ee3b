"""Ending a seed hold when it runs out: every worker's reconcile tick (and `campaign
reconcile`) calls `release_due`. By hand, `flashsend campaign release ID`
(producers.campaign_ops.release) ends it at any time. Both end in the one guarded statement
`release_hold` (sinks/sql/seeds.sql): exactly one releases, the others change nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg

from sinks.seed_store import ReleaseResult, SeedStore
from streams.rules.seed_list import RELEASED_BY_EXPIRY, hold_due


def release_due(
    conn: psycopg.Connection[Any], campaign_id: int, now: datetime
) -> ReleaseResult | None:
    """Release the hold when it is due; None when there is nothing to release."""
    store = SeedStore(conn)
    if not hold_due(store.state(campaign_id), now):
        return None
    return store.release(campaign_id, RELEASED_BY_EXPIRY)
