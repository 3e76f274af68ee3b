"""The event loop of a chaos run, and its verdict on the rows in doubt.

During the run, SES's events settle rows in doubt as in production: the stand-in publishes
them (signed SNS) to a real `flashsend webhook` process subscribed for the run's own
configuration set, which puts them on mail.events, where a real feedback worker applies them
(streams/rules/resolution.py). Only `Send` and `Reject` are subscribed: they settle every row the
stand-in accepted, and Delivery would double the events without settling anything more.

After the run, each row that is or was `unknown` is looked up at the stand-in (by address,
then campaign and seq tags): accepted or never seen. The run then waits, bounded, until every
accepted one is settled, and reports what is left. Their events may queue behind every other
event of the run: on a loaded machine the stand-in's emitter runs minutes behind the sends, and
a wait cut short leaves accepted rows unknown that their queued events would settle. So the
bound is on the time without progress (the feedback agent's offsets, or the stand-in's
deliveries to the webhook), capped at MAX_WAIT_FACTOR times that.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from flashsend.lab.feedback_run import WebhookProcess, with_feedback
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from infra.ses_standin.events_admin import SesEventsAdmin, lost
from producers.resend_unknown import feedback_offsets
from streams.rules.resolution import EVENT_BEFORE_ANSWER, RESOLVED_BY_EVENT

EVENT_TYPES = ("Send", "Reject")
MAX_LOOKUPS = 50_000  # rows looked up at the stand-in; beyond, the figures are left out
MAX_WAIT_FACTOR = 40  # the wait's cap, in units of the wait without progress

# Rows that are or were unknown: still unknown, or settled from unknown by an event.
_IN_DOUBT = """
SELECT seq, lower(btrim(email)), status, reason FROM campaign_recipients
 WHERE campaign_id = %s AND (status = 'unknown' OR reason = %s)
"""
_REASONS = """
SELECT count(*) FILTER (WHERE reason = %s), count(*) FILTER (WHERE reason = %s)
  FROM campaign_recipients WHERE campaign_id = %s
"""


@dataclass
class EventLoop:
    """The webhook process, its subscription at the stand-in and one feedback worker."""

    settings: Settings  # with the run's own configuration set, SNS topic and webhook port
    log_dir: Path
    events: SesEventsAdmin
    webhook: WebhookProcess | None = None
    sub_id: str | None = None
    feedback: WorkerPool | None = None
    restarts: dict[str, int] = field(default_factory=lambda: {"webhook": 0, "feedback": 0})
    lost_before: dict[str, int] = field(default_factory=dict)  # the stand-in's, at start

    @classmethod
    def settings_for(cls, settings: Settings) -> Settings:
        return with_feedback(settings)

    def start(self) -> None:
        self.lost_before = lost(self.events.subscriptions())
        self.webhook = WebhookProcess.start(self.settings, self.log_dir)
        sub = self.events.subscribe(
            self.webhook.sns_url,
            self.settings.sns_topic_arns[0],
            configuration_sets=[self.settings.marketing_configuration_set],
            event_types=list(EVENT_TYPES),
        )
        self.sub_id = str(sub["id"])
        self.events.wait_confirmed(self.sub_id)
        self.feedback = WorkerPool(self.settings, self.log_dir, role="feedback")
        self.feedback.start(1)

    def delivered(self) -> int:
        """Notifications the stand-in delivered to the run's webhook (2xx) so far."""
        sub = self.events.subscription(str(self.sub_id)) if self.sub_id else None
        return int(sub["delivery"]["delivered"]) if sub else 0

    def emission(self) -> dict[str, Any]:
        """What became of the events the stand-in owed the run's webhook: delivered, retried,
        refused (4xx), dropped (retry window over), and the stand-in's events lost since the
        start to a full buffer (overflow) or dropped for any subscription."""
        state = self.events.subscriptions()
        sub = next((s for s in state["subscriptions"] if s["id"] == self.sub_id), None)
        delivery = dict(sub["delivery"]) if sub else {}
        given_up = lost(state)
        return {
            **{k: delivery.get(k) for k in ("delivered", "retried", "refused", "dropped")},
            "pending_at_standin": state.get("pending"),
            **{f"standin_{k}": v - self.lost_before.get(k, 0) for k, v in given_up.items()},
        }

    def check(self) -> None:
        """Start again what died (the broker or PostgreSQL went away under it)."""
        if self.feedback is not None and not self.feedback.alive():
            self.feedback.procs.clear()
            self.feedback.start(1)
            self.restarts["feedback"] += 1
        if self.webhook is not None and self.webhook.proc.poll() is not None:
            self.webhook = WebhookProcess.start(self.settings, self.log_dir)
            self.restarts["webhook"] += 1

    def stop(self) -> None:
        """Every step is tried whatever the others did; the first error is raised at the end."""
        errors: list[BaseException] = []
        steps: list[Callable[[], object]] = []
        if self.sub_id is not None:
            steps.append(lambda: self.events.unsubscribe(str(self.sub_id)))
        if self.feedback is not None:
            steps.append(self.feedback.stop)
        if self.webhook is not None:
            steps.append(self.webhook.stop)
        for step in steps:
            try:
                step()
            except Exception as exc:
                errors.append(exc)
        self.sub_id = self.feedback = self.webhook = None
        if errors:
            raise errors[0]


def _in_doubt(settings: Settings, campaign_id: int) -> list[tuple[int, str, str, str | None]]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return [
            (int(s), str(e), str(st), r)
            for s, e, st, r in conn.execute(_IN_DOUBT, (campaign_id, RESOLVED_BY_EVENT))
        ]


def accepted_at_ses(
    events: SesEventsAdmin, campaign_id: int, rows: Iterable[tuple[int, str]]
) -> set[int]:
    """The seqs of (seq, address) the stand-in accepted for this campaign."""

    def accepted(row: tuple[int, str]) -> int | None:
        seq, email = row
        for message in events.messages(destination=email, limit=20):
            tags = message.get("tags") or {}
            if tags.get("campaign") == str(campaign_id) and tags.get("seq") == str(seq):
                return seq
        return None

    with ThreadPoolExecutor(max_workers=4) as pool:
        return {seq for seq in pool.map(accepted, list(rows)) if seq is not None}


def judge_in_doubt(
    settings: Settings,
    campaign_id: int,
    events: SesEventsAdmin,
    wait_s: float,
    log: Callable[[str], None],
    delivered: Callable[[], int] = lambda: 0,
) -> dict[str, Any]:
    """Look each row that is or was unknown up at the stand-in, wait for the events of the
    accepted ones to settle them, and count what is left. The wait ends when none is left, or
    after `wait_s` without progress (the feedback agent's stored offsets, or `delivered`: the
    stand-in's deliveries to the webhook), or at MAX_WAIT_FACTOR x `wait_s`: the events queue
    behind every other event of the run."""
    doubt = _in_doubt(settings, campaign_id)
    if len(doubt) > MAX_LOOKUPS:
        return {"unknown_lookup_skipped": len(doubt)}
    accepted = accepted_at_ses(events, campaign_id, [(s, e) for s, e, _st, _r in doubt])
    began = last_progress = time.monotonic()
    position: tuple[int, int] = (-1, -1)
    while True:
        doubt = _in_doubt(settings, campaign_id)
        waiting = {s for s, _e, st, _r in doubt if st == "unknown"} & accepted
        now = time.monotonic()
        if not waiting or now - last_progress >= wait_s or now - began >= MAX_WAIT_FACTOR * wait_s:
            break
        moved = (sum(feedback_offsets(settings).values()), delivered())
        if moved != position:
            position, last_progress = moved, now
        time.sleep(0.5)
    waited = time.monotonic() - began
    if waiting:
        log(f"chaos: {len(waiting):,} accepted row(s) still unknown after {waited:.0f}s")
    still = {s for s, _e, st, _r in doubt if st == "unknown"}
    resolved = {s for s, _e, st, r in doubt if st != "unknown" and r == RESOLVED_BY_EVENT}
    ever = still | resolved
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute(_REASONS, (RESOLVED_BY_EVENT, EVENT_BEFORE_ANSWER, campaign_id))
        counted = row.fetchone() or (0, 0)
    return {
        "unknown_resolved": int(counted[0]),
        "resolved_before_answer": int(counted[1]),
        "unknown_accepted_by_ses": len(ever & accepted),
        "unknown_never_accepted": len(ever - accepted),
        "unknown_accepted_unresolved": len(still & accepted),
        "resolved_not_accepted": len(resolved - accepted),
        "events_waited_s": round(waited, 1),
    }
