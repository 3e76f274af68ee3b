"""A campaign's rate ramp as `campaign status` shows it (streams/rules/ramp.py,
sinks/sql/ramp.sql)."""

from __future__ import annotations

from typing import Any

import psycopg

from flashsend.errors import NotFound
from sinks.queries import query
from streams.rules.ramp import effective_rate, format_ramp, position, ramp_from_rows


def ramp_status(conn: psycopg.Connection[Any], campaign_id: int) -> dict[str, Any] | None:
    """The ramp, where it stands after the campaign's sending time so far, the rate that
    applies (the step capped by rate_limit) and the next change; None without a ramp."""
    row = conn.execute(query("campaign_ramp"), {"id": campaign_id}).fetchone()
    if row is None:
        raise NotFound(f"campaign {campaign_id} does not exist")
    steps = ramp_from_rows(row[0])
    if not steps:
        return None
    elapsed = float(row[3])
    return {
        "ramp": format_ramp(steps),
        "sending_s": round(elapsed, 1),
        **position(steps, elapsed).to_dict(),
        "effective_rate": effective_rate(float(row[1]), steps, elapsed),
    }


def format_ramp_status(ramp: dict[str, Any] | None) -> str:
    """The ramp's line of `campaign status` ('' without a ramp)."""
    if ramp is None:
        return ""
    nxt = (
        f"next {ramp['next_rate']:g}/s in {ramp['next_in_s']:,.0f}s of sending"
        if ramp["next_rate"] is not None
        else "last step: holds"
    )
    return (
        f"\n  ramp step {ramp['step']}/{ramp['steps']} at {ramp['rate']:g}/s "
        f"(limit now {ramp['effective_rate']:g}/s) after {ramp['sending_s']:,.0f}s of sending; "
        f"{nxt}  [{ramp['ramp']}]"
    )
