"""`flashsend campaign resend-unknown`: mail again the rows whose SES call got no answer and
that no SES event has proved since. Never automatic: marketing is at-most-once, and sending
again a mail SES did accept is a duplicate. An operator runs it after a grace long enough for
SES's events to have arrived (they settle the rows they prove: streams/rules/resolution.py).

1. plan: the campaign's rows still `unknown` whose call started longer ago than the grace;
2. wait (bounded) until the feedback agent has applied every event mail.events holds now
   (one of them may prove a row), else refuse;
3. in one transaction under the campaign's reconcile lock: those rows → `pending`, flagged
   requeue, reason `resend_unknown`; a `done` campaign → `sending`; one audit row
   (unknown_resends) listing exactly the rows moved;
4. produce their doorbells as reconcile does (take_requeue), unless the campaign is paused
   (then `campaign resume` produces them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import KafkaException

from flashsend.deliverability import feedback_app_id
from flashsend.errors import FlashsendError
from flashsend.settings import Settings
from producers.reconcile import Reconciler
from producers.replay import operator
from sinks.audit_store import Actor
from sinks.metrics_state import Watermarks
from sinks.queries import query
from sinks.resolution_store import ResendDone, ResendPlan, UnknownRowsStore


class FeedbackBehind(FlashsendError):
    """The feedback agent has SES events left to apply: one of them may prove a row sent."""


def feedback_offsets(settings: Settings) -> dict[int, int]:
    """The feedback agent's stored next offset per partition of mail.events."""
    with psycopg.connect(settings.pg_dsn, autocommit=True, connect_timeout=5) as conn:
        return {
            int(p): int(o)
            for p, o in conn.execute(
                query("metrics_offsets"),
                {"group_id": feedback_app_id(settings), "topic": settings.topic_mail_events},
            )
        }


def unapplied(ends: dict[int, tuple[int, int]], stored: dict[int, int]) -> int:
    """Records below `ends` (per partition: low, high) the feedback agent has not applied."""
    return sum(max(0, high - max(stored.get(p, 0), low)) for p, (low, high) in ends.items())


def feedback_lag(settings: Settings) -> int:
    """Records of mail.events the feedback agent has not applied yet (log end minus the offset
    stored in PostgreSQL, summed over partitions). KafkaException when the broker is away."""
    ends = Watermarks(settings.kafka_bootstrap).ends(settings.topic_mail_events)
    return unapplied(ends, feedback_offsets(settings))


def plan_resend(settings: Settings, campaign_id: int, older_than_s: float) -> ResendPlan:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return UnknownRowsStore(conn).plan(campaign_id, older_than_s)


def check_feedback_caught_up(settings: Settings, wait_s: float = 60.0) -> None:
    """Returns once the feedback agent has applied every record mail.events holds now (events
    arriving later came after the grace); FeedbackBehind after `wait_s`, or when it cannot be
    told. mail.events never stops growing while anything sends, hence "holds now"."""
    try:
        ends = Watermarks(settings.kafka_bootstrap).ends(settings.topic_mail_events)
        deadline = time.monotonic() + wait_s
        while (left := unapplied(ends, feedback_offsets(settings))) > 0:
            if time.monotonic() > deadline:
                raise FeedbackBehind(
                    f"the feedback agent still has {left:,} record(s) of "
                    f"{settings.topic_mail_events} to apply after {wait_s:.0f}s (is `flashsend "
                    "worker --role feedback` running?); an unapplied Send event would make a "
                    "resend a duplicate. Try again later, or pass --ignore-feedback-lag"
                )
            time.sleep(0.5)
    except (KafkaException, psycopg.Error) as exc:
        raise FeedbackBehind(
            f"cannot tell whether the feedback agent has applied every SES event ({exc}); "
            "fix that or pass --ignore-feedback-lag"
        ) from exc


@dataclass(frozen=True)
class ResendResult:
    done: ResendDone
    produced: int  # doorbells produced now (0 for a paused campaign: resume produces them)

    def as_dict(self) -> dict[str, Any]:
        return {
            "campaign_status_before": self.done.campaign_status,
            "moved": self.done.moved,
            "reopened": self.done.reopened,
            "audit_id": self.done.audit_id,
            "produced": self.produced,
        }


def resend_unknown(
    settings: Settings, plan: ResendPlan, *, reason: str, actor: Actor | None = None
) -> ResendResult:
    """Queue the plan's rows again (those still unknown) and produce their doorbells."""
    who, host = operator(settings)
    if actor is not None and not actor.who.startswith("cli:"):
        who, host = actor.who, actor.source or host
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        done = UnknownRowsStore(conn).resend(
            plan, requested_by=who, host=host, reason=reason, actor=actor
        )
    produced = 0
    if done.moved and done.campaign_status != "paused":
        with Reconciler(settings) as reconciler:
            produced = reconciler.reconcile(plan.campaign_id, wait=True).requeued
    return ResendResult(done, produced)
