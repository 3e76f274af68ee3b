"""Scheduled sending around the campaign's start and its reconcile tick.

- `plan_snapshot` turns a campaign's plan (streams/rules/send_plan.py) into the snapshot's
  parameters with an injected `now`: each audience zone's send_after, or the waves' starts
  and slots. Rows due at `now` are snapshotted pending and produced by the start; the others
  are `held` in slots (sinks/sql/schedule.sql, record_slots).
- `release_due` is the scheduler: every worker's reconcile tick (producers/reconcile.py) calls
  it for a sending campaign with held rows; due slots become pending + requeue and the same
  tick produces their doorbells (take_requeue). One statement per tick, whatever the number
  of recipients or zones; no message or timer per user.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from flashsend.settings import Settings
from sinks.schedule_store import ScheduleStore
from streams.rules.send_plan import plan_waves, plan_zones

# The snapshot's plan parameters when the campaign sends everything at start.
NO_PLAN: dict[str, Any] = {
    "zone_names": None,
    "zone_at": None,
    "zone_until": None,
    "wave_starts": None,
    "wave_slots": None,
    "wave_widths": None,
    "recent_since": None,
    "recent_wave": None,
    "rest_wave": None,
}


@dataclass(frozen=True)
class SnapshotPlan:
    params: dict[str, Any]
    scheduled: bool = False
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def order(self) -> sql.SQL:
        return sql.SQL("a.send_after, a.id" if self.scheduled else "a.id")


def plan_snapshot(
    settings: Settings,
    conn: psycopg.Connection[Any],
    campaign_id: int,
    audience: str,
    now: datetime,
) -> SnapshotPlan:
    store = ScheduleStore(conn)
    schedule = store.schedule(campaign_id)
    if schedule is None:
        return SnapshotPlan({**NO_PLAN, "now": now})
    notes: dict[str, Any] = {"planned_at": now.isoformat()}
    if schedule.window is not None:
        zones = plan_zones(
            schedule.window, store.audience_zones(audience), settings.default_timezone, now
        )
        notes["default_timezone"] = settings.default_timezone
        notes["unknown_timezones"] = zones.unknown
        params = {
            **NO_PLAN,
            "zone_names": zones.names,
            "zone_at": zones.send_after,
            "zone_until": zones.until,
        }
    else:
        waves = plan_waves(schedule.waves, now, settings.recent_engagement_days)
        notes["recent_since"] = waves.recent_since.isoformat()
        params = {
            **NO_PLAN,
            "wave_starts": waves.starts,
            "wave_slots": waves.slots,
            "wave_widths": waves.widths_s,
            "recent_since": waves.recent_since,
            "recent_wave": waves.recent_wave,
            "rest_wave": waves.rest_wave,
        }
    return SnapshotPlan({**params, "now": now}, scheduled=True, notes=notes)


def record_plan(
    conn: psycopg.Connection[Any], plan: SnapshotPlan, partition: sql.Identifier, campaign_id: int
) -> None:
    """In the snapshot's transaction, after its insert: the slots and the planning notes."""
    if not plan.scheduled:
        return
    store = ScheduleStore(conn)
    store.record_slots(partition, campaign_id, plan.params["now"])
    store.note(campaign_id, plan.notes)


def release_due(conn: psycopg.Connection[Any], campaign_id: int, now: datetime) -> int:
    """Release the campaign's slots due at `now`; returns the rows made pending (flagged
    requeue: the caller's take_requeue produces them)."""
    return ScheduleStore(conn).release_due(campaign_id, now).rows
