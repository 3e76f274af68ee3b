"""Transactional mail decisions, pure: no I/O, `now` and the random source passed in.

- `parse_order_event`: what an order event asks the mail service to do, or why it is poison
  (dead-letter at once) or stale (ignored: the replay trap).
- `decide_after_call`: what a SendEmail answer (or the lack of one) means for the mail row.
- `lifecycle_events` / `cancel_result`: which lifecycle events a transition publishes.
- `check_lease`, `purge_horizon`: the configuration rules that keep the guarantees.

The one fact everything here rests on: SES has no idempotency key, so a call that got no
answer may have sent the mail. Such a call is the duplicate window, and its size is one
provider call: at-most-once templates turn it into `unknown` (never resent automatically),
at-least-once templates resend (a customer may get two copies, never zero).
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from streams.rules.backoff import RetryPolicy
from streams.rules.field_domains import epoch_ms_problem, key_problem, text_problem, uuid_problem
from streams.rules.outcomes import Outcome, classify_call_error, is_throttle

SUPPORTED_VERSIONS: Mapping[str, frozenset[int]] = {
    "OrderConfirmed": frozenset({1}),
    "OrderCancelled": frozenset({1}),
}
DEFAULT_TEMPLATES: Mapping[str, str] = {"OrderConfirmed": "order_confirmation"}
# SES template names are at most 64 characters.
MAX_TEMPLATE_CHARS = 64
# The longest delay a delayed mail may ask for; further out is a unit error, not a plan.
MAX_SEND_DELAY_MS = 366 * 86_400_000
LIFECYCLE_TYPES = frozenset({"EmailSent", "EmailFailed", "EmailCancelled", "EmailCancelTooLate"})


class Delivery(StrEnum):
    AT_LEAST_ONCE = "at_least_once"  # no answer -> resend: maybe twice, never zero
    AT_MOST_ONCE = "at_most_once"  # no answer -> unknown: maybe zero, never twice


def delivery_for(template: str, at_most_once_templates: Collection[str]) -> Delivery:
    return Delivery.AT_MOST_ONCE if template in at_most_once_templates else Delivery.AT_LEAST_ONCE


def confirmation_key(order_id: int) -> str:
    """The intent, not the time: one confirmation per order (seed trap 8 of architecture 1)."""
    return f"order-confirmed:{order_id}"


def cancel_targets(order_id: int) -> list[str]:
    """Keys an OrderCancelled must reach even if their create has not arrived yet (tombstones).
    Live mails of the same order under other keys are found by `ref` in the statement."""
    return [confirmation_key(order_id)]


def ms_to_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC)


# ---- order events -> commands ------------------------------------------------------------


@dataclass(frozen=True)
class CreateMail:
    event_id: str
    dedupe_key: str
    ref: str
    to_email: str
    template: str
    data: dict[str, Any]
    delivery: Delivery
    send_after: datetime | None
    occurred_at: datetime


@dataclass(frozen=True)
class CancelMail:
    event_id: str
    ref: str
    keys: list[str]


@dataclass(frozen=True)
class StaleEvent:
    """A confirmation older than the configured age (the replay trap): no mail is created, and
    the event is recorded (mail_stale_events) so `flashsend mail status KEY` can say why."""

    event_id: str
    dedupe_key: str
    ref: str
    event_type: str
    occurred_at: datetime
    age_s: float

    @property
    def reason(self) -> str:
        return f"stale: occurred {self.age_s:.0f}s ago"


@dataclass(frozen=True)
class Poison:
    reason: str  # short, goes into the dead-letter headers
    detail: str = ""


Command = CreateMail | CancelMail | StaleEvent
Parsed = CreateMail | CancelMail | StaleEvent | Poison


def parse_order_event(
    event: Mapping[str, Any],
    *,
    now_ms: int,
    max_age_s: float,
    at_most_once_templates: Collection[str],
) -> Parsed:
    """Decide what one decoded order event means. Never raises on bad content: it is Poison.

    A cancel is applied whatever its age: one replayed the next day (after an outage, from the
    dead-letter topic) must still stop the delayed mail of a cancelled order, and applying an
    old cancel twice changes nothing. Only a confirmation obeys the age rule (a replay of last
    week must not mail anyone). Every field that reaches a column or a conversion is checked
    against its domain first (streams.rules.field_domains)."""
    event_type = event.get("event_type")
    versions = SUPPORTED_VERSIONS.get(str(event_type))
    if versions is None:
        return Poison("unknown_event_type", str(event_type)[:200])
    version = event.get("version")
    if version not in versions:
        return Poison("unsupported_version", f"{event_type} v{version}")
    event_id, order_id = event.get("event_id"), event.get("order_id")
    if not event_id or not isinstance(order_id, int) or isinstance(order_id, bool):
        return Poison("missing_field", "event_id and order_id are required")
    problem = uuid_problem(event_id)
    if problem is not None:
        return Poison("bad_event_id", problem)
    problem = text_problem(event)
    if problem is not None:
        return Poison("bad_text", problem)
    if event_type == "OrderCancelled":
        return CancelMail(str(event_id), str(order_id), cancel_targets(order_id))
    occurred_ms = event.get("occurred_at")
    problem = epoch_ms_problem(occurred_ms, now_ms=now_ms)
    if problem is not None:
        return Poison("bad_timestamp", f"occurred_at: {problem}")
    assert isinstance(occurred_ms, int)
    dedupe_key = event.get("dedupe_key") or confirmation_key(order_id)
    problem = key_problem(dedupe_key)
    if problem is not None:
        return Poison("bad_key", f"dedupe_key: {problem}")
    if max_age_s > 0 and now_ms - occurred_ms > max_age_s * 1000:
        return StaleEvent(
            event_id=str(event_id),
            dedupe_key=str(dedupe_key),
            ref=str(order_id),
            event_type=str(event_type),
            occurred_at=ms_to_datetime(occurred_ms),
            age_s=(now_ms - occurred_ms) / 1000,
        )
    email = event.get("email")
    if not email or "@" not in str(email):
        return Poison("bad_email", repr(email)[:200])
    template = event.get("template") or DEFAULT_TEMPLATES[str(event_type)]
    problem = key_problem(template, MAX_TEMPLATE_CHARS)
    if problem is not None:
        return Poison("bad_key", f"template: {problem}")
    send_after = event.get("send_after")
    if send_after is not None:
        problem = epoch_ms_problem(send_after, now_ms=now_ms, max_ahead_ms=MAX_SEND_DELAY_MS)
        if problem is not None:
            return Poison("bad_timestamp", f"send_after: {problem}")
    data = {
        "order_id": order_id,
        "customer_name": event.get("customer_name") or "",
        "total": event.get("total") or "",
        "currency": event.get("currency") or "",
        "items": list(event.get("items") or []),
        "locale": event.get("locale") or "en",
    }
    return CreateMail(
        event_id=str(event_id),
        dedupe_key=str(dedupe_key),
        ref=str(order_id),
        to_email=str(email),
        template=str(template),
        data=data,
        delivery=delivery_for(str(template), at_most_once_templates),
        send_after=ms_to_datetime(send_after) if send_after is not None else None,
        occurred_at=ms_to_datetime(occurred_ms),
    )


# ---- after a SendEmail call ---------------------------------------------------------------


class Next(StrEnum):
    SENT = "sent"
    RETRY = "retry"  # back to pending at retry_at (or cancelled, if a cancel arrived)
    FAILED = "failed"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Decision:
    next: Next
    reason: str | None = None
    retry_at: float | None = None  # epoch seconds, for Next.RETRY
    counts_as_error: bool = True  # spends the retry budget (a throttle does not)


def decide_after_call(
    *,
    code: str | None,
    http_status: int | None,
    timed_out: bool,
    delivery: Delivery,
    send_errors: int,
    policy: RetryPolicy,
    now: float,
    rng: random.Random,
) -> Decision:
    """What a failed SendEmail means. (A successful one is simply Next.SENT.)

    The classification is the campaign sender's (streams.rules.outcomes), read for one mail:
    - no answer (timeout, dropped connection, 5xx): SES may have sent it. At-most-once ->
      UNKNOWN; at-least-once -> RETRY, and UNKNOWN (not failed) once the budget is spent.
    - throttled: RETRY without spending the budget (SES refused the call before sending).
    - refused before sending (connection refused, 408), account paused: RETRY with budget.
    - a 4xx validation error, rejected message, missing template: FAILED at once.
    """
    reason = code or "no_response"
    outcome = classify_call_error(code, http_status, timed_out=timed_out)
    if outcome is Outcome.UNKNOWN:
        if delivery is Delivery.AT_MOST_ONCE:
            return Decision(Next.UNKNOWN, f"no_answer:{reason}")
        return _retry_or(Next.UNKNOWN, f"no_answer:{reason}", send_errors, policy, now, rng)
    if is_throttle(code, http_status):
        delay = policy.delay(min(send_errors + 1, 10), rng)
        return Decision(Next.RETRY, f"throttled:{reason}", now + delay, counts_as_error=False)
    if outcome is Outcome.FAILED:
        return Decision(Next.FAILED, f"rejected:{reason}")
    # RETRY (refused before sending) or PAUSE_CAMPAIGN (account paused: wait, then retry)
    return _retry_or(Next.FAILED, f"error:{reason}", send_errors, policy, now, rng)


def _retry_or(
    give_up: Next,
    reason: str,
    send_errors: int,
    policy: RetryPolicy,
    now: float,
    rng: random.Random,
) -> Decision:
    retry_at = policy.next_attempt_at(send_errors + 1, now, rng)
    if retry_at is None:
        return Decision(give_up, f"{reason}:retries_exhausted")
    return Decision(Next.RETRY, reason, retry_at)


# ---- lifecycle events --------------------------------------------------------------------


def lifecycle_events(status: str, cancel_requested: bool) -> list[str]:
    """Events a row publishes when it reaches `status` through the sender or the sweeper.

    A cancel that arrived while the mail was in flight is answered here: if the mail went (or
    may have gone) the order service hears EmailCancelTooLate; if it did not, EmailCancelled.
    """
    events = {
        "sent": ["EmailSent"],
        "failed": ["EmailFailed"],
        "unknown": ["EmailFailed"],  # mail_status 'unknown' tells it apart
        "suppressed": ["EmailFailed"],  # mail_status 'suppressed', reason suppressed:<why>
        "cancelled": ["EmailCancelled"],
    }.get(status, [])
    if cancel_requested and status in ("sent", "unknown"):
        events = [*events, "EmailCancelTooLate"]
    return events


class CancelResult(StrEnum):
    CANCELLED = "cancelled"  # was pending: in time
    TOMBSTONE = "tombstone"  # no row yet: a late create will be swallowed
    IN_FLIGHT = "in_flight"  # was sending: retries stopped, the sender reports the end
    TOO_LATE = "too_late"  # already sent (or maybe: unknown)
    NOTHING = "nothing"  # failed or cancelled before: nothing to do


def cancel_result(old_status: str | None, tombstone: bool) -> CancelResult:
    if tombstone or old_status is None:
        return CancelResult.TOMBSTONE
    return {
        "pending": CancelResult.CANCELLED,
        "sending": CancelResult.IN_FLIGHT,
        "sent": CancelResult.TOO_LATE,
        "unknown": CancelResult.TOO_LATE,
    }.get(old_status, CancelResult.NOTHING)


def cancel_events(result: CancelResult) -> list[str]:
    if result in (CancelResult.CANCELLED, CancelResult.TOMBSTONE):
        return ["EmailCancelled"]
    if result is CancelResult.TOO_LATE:
        return ["EmailCancelTooLate"]
    return []


# ---- configuration rules -----------------------------------------------------------------


class ConfigError(ValueError):
    """A configuration that would break a guarantee."""


def worst_send_s(timeout_s: float) -> float:
    """Upper bound of one SendEmail through botocore with retries off: connect + read timeout,
    each of which may be hit once, plus request signing and a slow event loop. Measured (tests)
    below this; the seed measured a "3 s" timeout taking 6.4 s, so never trust the setting alone.
    """
    return min(timeout_s, 2.0) + timeout_s + 2.0


def check_lease(
    lease_s: float, timeout_s: float, *, concurrency: int = 1, rate: float = 0.0
) -> None:
    """The lease must outlast the wait for the rate limiter plus the worst send, or a second
    worker resends a mail in flight. A worker holds at most `concurrency` claimed mails, each
    with one reservation at `rate`, so none waits longer than concurrency / rate before its
    call."""
    worst = worst_send_s(timeout_s)
    queued = concurrency / rate if rate > 0 else 0.0
    if lease_s <= queued + 2 * worst:
        raise ConfigError(
            f"mail lease {lease_s:g}s must exceed the limiter's wait {queued:g}s "
            f"({concurrency} mails in flight at {rate:g}/s) plus twice the worst send time "
            f"{worst:g}s (SES timeout {timeout_s:g}s): raise FLASHSEND_MAIL_LEASE_S or lower "
            "FLASHSEND_MAIL_CONCURRENCY"
        )


def purge_horizon(
    now: float, *, retention_s: float, topic_retention_s: float, max_event_age_s: float
) -> float:
    """Oldest created_at a terminal row may have before it is purged (epoch seconds).

    Dedupe keys must outlive every event the broker can still replay (seed architecture-2
    trap 4, cancel trap 5): the retention must cover the topic's retention, and the stale-event
    filter must be shorter than it so a replayed event older than the keys is ignored anyway.
    """
    if topic_retention_s <= 0:
        raise ConfigError("the topic keeps events forever: dedupe keys cannot be purged")
    if retention_s < topic_retention_s:
        raise ConfigError(
            f"mail retention {retention_s:g}s is shorter than the topic's retention "
            f"{topic_retention_s:g}s: a replay would send old mail again"
        )
    if max_event_age_s <= 0 or max_event_age_s > retention_s:
        raise ConfigError("mail_event_max_age_s must be > 0 and below the mail retention")
    return now - retention_s
