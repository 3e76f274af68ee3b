"""Campaign control and progress for the CLI (synchronous psycopg)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row

from flashsend.errors import Conflict, NotFound, UsageError
from sinks.audit_store import Actor, record
from sinks.queries import query

# A campaign in one of these states sends nothing more; its rows' statuses are final.
SETTLED = frozenset({"cancelled", "done", "failed"})

# Which states each control command may move a campaign from.
TRANSITIONS: dict[str, list[str]] = {
    "paused": ["sending"],
    "sending": ["paused"],
    "cancelled": ["draft", "sending", "paused", "snapshotting"],
    "done": ["sending"],
}


@dataclass(frozen=True)
class Progress:
    row: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.row[key]

    @property
    def terminal(self) -> int:
        r = self.row
        return int(r["sent"] + r["failed"] + r["unknown"] + r["skipped"] + r["cancelled"])

    @property
    def total(self) -> int:
        return int(self.row["recipients"] or 0)

    @property
    def finished(self) -> bool:
        # An A/B test's holdout or a seed hold's audience (`held`) waits: not finished.
        r = self.row
        seed = r.get("seed") or {}
        return (
            r["pending"] == 0
            and r["sending"] == 0
            and not r.get("held")
            and not seed.get("pending")
            and not seed.get("sending")
            and self.total > 0
        )

    @property
    def send_rate(self) -> float:
        r = self.row
        first, last = r["first_sent_epoch"], r["last_sent_epoch"]
        if not r["sent"] or first is None or last is None or last <= first:
            return 0.0
        return float(r["sent"]) / float(last - first)

    def as_dict(self) -> dict[str, Any]:
        out = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in self.row.items()}
        for k in ("elapsed_s", "first_sent_epoch", "last_sent_epoch"):
            if out.get(k) is not None:
                out[k] = float(out[k])
        out["send_rate_per_s"] = round(self.send_rate, 1)
        return out


class CampaignStore:
    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def create(
        self,
        *,
        name: str,
        template: str,
        from_address: str,
        configuration_set: str | None,
        rate_limit: float,
        audience_condition: str,
        channel: str = "email",
        rate_unit: str = "messages",
    ) -> int:
        row = self.conn.execute(
            query("create_campaign"),
            {
                "name": name,
                "template": template,
                "from_address": from_address,
                "configuration_set": configuration_set,
                "rate_limit": rate_limit,
                "audience_condition": audience_condition,
                "channel": channel,
                "rate_unit": rate_unit,
            },
        ).fetchone()
        assert row is not None
        return int(row[0])

    def feedback_lag(self, fresh_s: float) -> float | None:
        """Seconds the feedback agent's oldest unapplied event has waited (its reports younger
        than `fresh_s`); 0 when none is behind, None when none reports."""
        row = self.conn.execute(query("feedback_lag"), {"fresh_s": fresh_s}).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def progress(self, campaign_id: int) -> Progress:
        cur = self.conn.cursor(row_factory=dict_row)
        cur.execute(query("campaign_progress"), {"id": campaign_id})
        row = cur.fetchone()
        if row is None:
            raise NotFound(f"campaign {campaign_id} does not exist")
        # The counters count every row; a seed list's rows are not audience: shown apart.
        seed = row.get("seed") or {}
        for status, n in seed.items():
            if status in row:
                row[status] -= n
        row["seed"] = seed
        return Progress(row)

    def status(self, campaign_id: int) -> str:
        row = self.conn.execute(
            "SELECT status FROM campaigns WHERE id = %s", (campaign_id,)
        ).fetchone()
        if row is None:
            raise NotFound(f"campaign {campaign_id} does not exist")
        return str(row[0])

    def transition(
        self,
        campaign_id: int,
        status: str,
        reason: str | None,
        actor: Actor | None = None,
        action: str | None = None,
    ) -> str:
        """One compare-and-set (set_campaign_status: `WHERE status = ANY(<allowed from>)`)
        under the row lock, with its audit row in the same transaction; returns the state it
        changed from. Conflict (with the current state) when the campaign is elsewhere."""
        with self.conn.transaction():
            locked = self.conn.execute(query("lock_campaign_status"), {"id": campaign_id})
            before_row = locked.fetchone()
            if before_row is None:
                raise NotFound(f"campaign {campaign_id} does not exist")
            before = str(before_row[0])
            row = self.conn.execute(
                query("set_campaign_status"),
                {
                    "id": campaign_id,
                    "status": status,
                    "reason": reason,
                    "from_statuses": TRANSITIONS[status],
                },
            ).fetchone()
            if row is None:
                raise Conflict(
                    f"campaign {campaign_id} is {before}; cannot make it {status}", state=before
                )
            record(
                self.conn,
                actor,
                action or status,
                campaign_id,
                before,
                status,
                {"reason": reason} if reason else None,
            )
        if status == "cancelled":
            self.cancel_pending(campaign_id)
        return before

    def finish(self, campaign_id: int) -> None:
        """Mark a campaign whose rows are all terminal done, as reconcile's next tick would;
        reconcile may have done it meanwhile, which is fine."""
        try:
            self.transition(campaign_id, "done", None)
        except UsageError:
            if self.status(campaign_id) != "done":
                raise

    def cancel_pending(self, campaign_id: int, attempts: int = 10) -> int:
        """Every still-pending row → cancelled, after the status change has committed (so no
        new claim touches the campaign). A claim or result transaction still in flight locks
        rows in another order than this bulk UPDATE, and PostgreSQL may break the tie by
        aborting us (deadlock detected, measured in a bench run): retry, it is idempotent."""
        for attempt in range(1, attempts + 1):
            try:
                with self.conn.transaction():
                    cur = self.conn.execute(query("cancel_pending"), {"id": campaign_id})
                    return cur.rowcount
            except (psycopg.errors.DeadlockDetected, psycopg.errors.LockNotAvailable):
                if attempt == attempts:
                    raise
                time.sleep(0.05 * attempt)
        return 0
