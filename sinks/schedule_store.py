"""Scheduled sending's view of PostgreSQL (synchronous psycopg): the plan at create, the
slots at snapshot, the scheduler's release and per-slot progress, one method per named
statement (sinks/sql/schedule.sql).

`release_due` is the scheduler's only transition: one statement, guarded by the campaign's
status and each slot's `released_at IS NULL`, so every worker's reconcile tick may run it at
once and each slot is released exactly once, never for a paused or cancelled campaign.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from flashsend.errors import NotFound, UsageError
from sinks.queries import query
from streams.rules.send_plan import Schedule


@dataclass(frozen=True)
class SlotProgress:
    slot_at: datetime
    recipients: int
    released_at: datetime | None
    sent: int
    waiting: int  # held: not yet due
    in_progress: int  # pending or sending
    other: int  # skipped, failed, unknown, cancelled

    def as_dict(self) -> dict[str, Any]:
        return {
            "slot_at": self.slot_at.isoformat(),
            "recipients": self.recipients,
            "released_at": self.released_at.isoformat() if self.released_at else None,
            "sent": self.sent,
            "waiting": self.waiting,
            "in_progress": self.in_progress,
            "other": self.other,
        }


@dataclass(frozen=True)
class Released:
    slots: int
    rows: int


class ScheduleStore:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def set_schedule(self, campaign_id: int, schedule: Schedule) -> None:
        row = self.conn.execute(
            query("set_campaign_schedule"),
            {"id": campaign_id, "schedule": json.dumps(schedule.to_dict())},
        ).fetchone()
        if row is None:
            raise UsageError(f"campaign {campaign_id} is not a draft: its schedule is fixed")

    def stored(self, campaign_id: int) -> dict[str, Any] | None:
        """The campaign's plan and what its snapshot noted; None when it is not scheduled."""
        row = self.conn.execute(query("campaign_schedule"), {"id": campaign_id}).fetchone()
        if row is None:
            raise NotFound(f"campaign {campaign_id} does not exist")
        return dict(row[0]) if row[0] else None

    def schedule(self, campaign_id: int) -> Schedule | None:
        stored = self.stored(campaign_id)
        return Schedule.of(stored) if stored else None

    def audience_zones(self, audience: str) -> list[tuple[str | None, int]]:
        stmt = sql.SQL(query("audience_zones")).format(audience=sql.SQL(audience))
        return [(r[0], int(r[1])) for r in self.conn.execute(stmt).fetchall()]

    def record_slots(self, partition: sql.Identifier, campaign_id: int, now: datetime) -> int:
        stmt = sql.SQL(query("record_slots")).format(partition=partition)
        return self.conn.execute(stmt, {"campaign_id": campaign_id, "now": now}).rowcount

    def note(self, campaign_id: int, notes: dict[str, Any]) -> None:
        self.conn.execute(query("note_schedule"), {"id": campaign_id, "notes": json.dumps(notes)})

    def release_due(self, campaign_id: int, now: datetime) -> Released:
        with self.conn.transaction():
            row = self.conn.execute(
                query("release_due_slots"), {"id": campaign_id, "now": now}
            ).fetchone()
        assert row is not None
        return Released(int(row[0]), int(row[1]))

    def next_slot(self, campaign_id: int) -> datetime | None:
        row = self.conn.execute(query("next_slot"), {"id": campaign_id}).fetchone()
        return row[0] if row else None

    def progress(self, campaign_id: int) -> list[SlotProgress]:
        return [
            SlotProgress(r[0], int(r[1]), r[2], int(r[3]), int(r[4]), int(r[5]), int(r[6]))
            for r in self.conn.execute(query("slot_progress"), {"id": campaign_id}).fetchall()
        ]


def schedule_summary(store: ScheduleStore, campaign_id: int) -> dict[str, Any] | None:
    """What status, report and the demo show for a scheduled campaign: the plan, what the
    snapshot noted, and each slot's progress."""
    stored = store.stored(campaign_id)
    if stored is None:
        return None
    slots = store.progress(campaign_id)
    return {
        **stored,
        "slots": [s.as_dict() for s in slots],
        "slots_released": sum(1 for s in slots if s.released_at is not None),
        "waiting": sum(s.waiting for s in slots),
    }
