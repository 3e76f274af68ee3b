"""The demo's scheduled sending (`flashsend demo --local-window … | --waves …`).

The demo gives its audience time zones (a fixed list, by user id) or recent opens (every
fifth user opened three days ago), creates the campaign with the plan, and plays the
scheduler with a compressed clock: it starts at the real time, and once the slots released so
far are sent (nothing pending or sending) it jumps to the next slot's time and runs the same
reconcile pass the workers run, with that clock. Slots are released by the one guarded
statement (release_due_slots) and sent by the real workers; the workers' own reconcile, on
the real clock, finds nothing due meanwhile (every slot is in the real future)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg

from flashsend.settings import Settings
from producers.reconcile import Reconciler
from sinks.schedule_store import ScheduleStore, schedule_summary
from streams.rules.send_plan import Schedule

# Zones the demo spreads its users over (by user id): a day's worth of offsets, one of them
# unknown on purpose (counted, sent as the default zone).
DEMO_ZONES = (
    "Asia/Ho_Chi_Minh",
    "Asia/Tokyo",
    "Europe/Paris",
    "America/New_York",
    "America/Los_Angeles",
    "Australia/Sydney",
    "UTC",
    "Mars/Olympus_Mons",
)
POLL_S = 0.3  # the demo's poll while a scheduled campaign runs: a slot a few polls long


def prepare_users(settings: Settings, schedule: Schedule, users: int) -> None:
    """Zones (local window) or recent opens (waves) for the demo's audience, users 1..N."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        if schedule.window is not None:
            conn.execute(
                "UPDATE users SET timezone = (%(zones)s::text[])[1 + id %% %(k)s] "
                "WHERE id <= %(n)s",
                {"zones": list(DEMO_ZONES), "k": len(DEMO_ZONES), "n": users},
            )
        else:
            conn.execute(
                "UPDATE users SET last_open_at = CASE WHEN id %% 5 = 0 "
                "THEN now() - interval '3 days' END WHERE id <= %(n)s",
                {"n": users},
            )


class DemoScheduler:
    """The compressed clock: jump to the next slot once the released ones are sent."""

    def __init__(self, settings: Settings, campaign_id: int, log: Any) -> None:
        self.settings = settings
        self.campaign_id = campaign_id
        self.log = log
        self.now = datetime.now(UTC)
        self.jumps = 0
        self._reconciler = Reconciler(settings, clock=lambda: self.now)

    def tick(self, conn: psycopg.Connection[Any], progress: Any) -> None:
        if progress["status"] != "sending" or not progress["held"]:
            return
        if progress["pending"] or progress["sending"]:
            return
        slot = ScheduleStore(conn).next_slot(self.campaign_id)
        if slot is None:
            return
        self.now = max(self.now, slot)
        result = self._reconciler.reconcile(self.campaign_id, wait=True)
        self.jumps += 1
        self.log(f"\nclock → {slot.isoformat()}: {result.requeued:,} recipient(s) released")

    def close(self) -> None:
        self._reconciler.close()


def schedule_report(settings: Settings, campaign_id: int) -> dict[str, Any]:
    """The summary's `schedule` and `slots` (each slot's time, total, sent and waiting)."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        summary = schedule_summary(ScheduleStore(conn), campaign_id)
    if summary is None:
        return {}
    slots = summary.pop("slots")
    return {
        "schedule": summary,
        "slots": [
            {k: s[k] for k in ("slot_at", "recipients", "sent", "waiting", "other")} for s in slots
        ],
    }
