"""`flashsend campaign resend-unknown`: mail again the rows whose SES call got no answer and
that no SES event has proved since. Never automatic: marketing is at-most-once, and sending
again a mail SES did accept is a duplicate. An operator runs it after a grace long enough for
SES's events to have arrived (they settle the rows they prove: streams/resolution.py).

1. plan: the campaign's rows still `unknown` whose call started longer ago than the grace;
2. refuse while the feedback agent has events left to apply (one of them may prove a row);
3. in one transaction under the campaign's reconcile lock: those rows → `pending`, flagged
   requeue, reason `resend_unknown`; a `done` campaign → `sending`; one audit row
   (unknown_resends) listing exactly the rows moved;
4. produce their doorbells as reconcile does (take_requeue), unless the campaign is paused
   (then `campaign resume` produces them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import KafkaException

from flashsend.deliverability import feedback_app_id
from flashsend.errors import FlashsendError
from flashsend.metrics_state import Watermarks
from flashsend.settings import Settings
from producers.reconcile import Reconciler
from producers.replay import operator
from sinks.queries import query
from sinks.resolution_store import ResendDone, ResendPlan, UnknownRowsStore


class FeedbackBehind(FlashsendError):
    """The feedback agent has SES events left to apply: one of them may prove a row sent."""


def feedback_lag(settings: Settings) -> int:
    """Records of mail.events the feedback agent has not applied yet (log end minus the offset
    stored in PostgreSQL, summed over partitions). KafkaException when the broker is away."""
    topic = settings.topic_mail_events
    ends = Watermarks(settings.kafka_bootstrap).ends(topic)
    with psycopg.connect(settings.pg_dsn, autocommit=True, connect_timeout=5) as conn:
        stored = {
            int(p): int(o)
            for p, o in conn.execute(
                query("metrics_offsets"),
                {"group_id": feedback_app_id(settings), "topic": topic},
            )
        }
    return sum(max(0, high - max(stored.get(p, 0), low)) for p, (low, high) in ends.items())


def plan_resend(settings: Settings, campaign_id: int, older_than_s: float) -> ResendPlan:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return UnknownRowsStore(conn).plan(campaign_id, older_than_s)


def check_feedback_caught_up(settings: Settings) -> int:
    """The feedback lag; FeedbackBehind when events wait or the lag cannot be read."""
    try:
        lag = feedback_lag(settings)
    except (KafkaException, psycopg.Error) as exc:
        raise FeedbackBehind(
            f"cannot tell whether the feedback agent has applied every SES event ({exc}); "
            "fix that or pass --ignore-feedback-lag"
        ) from exc
    if lag:
        raise FeedbackBehind(
            f"the feedback agent has {lag:,} record(s) of {settings.topic_mail_events} left to "
            "apply (is `flashsend worker --role feedback` running?); an unapplied Send event "
            "would make a resend a duplicate. Wait, or pass --ignore-feedback-lag"
        )
    return lag


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


def resend_unknown(settings: Settings, plan: ResendPlan, *, reason: str) -> ResendResult:
    """Queue the plan's rows again (those still unknown) and produce their doorbells."""
    who, host = operator(settings)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        done = UnknownRowsStore(conn).resend(plan, requested_by=who, host=host, reason=reason)
    produced = 0
    if done.moved and done.campaign_status != "paused":
        with Reconciler(settings) as reconciler:
            produced = reconciler.reconcile(plan.campaign_id, wait=True).requeued
    return ResendResult(done, produced)
