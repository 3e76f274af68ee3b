"""Rows in doubt, settled by SES's own events (pure).

Marketing is at-most-once: a row whose SES call got no answer is `unknown` and is never resent
automatically. SES itself knows better. Every bulk entry carries the tags `campaign` and `seq`,
and every event SES publishes for the message carries them back, so an event names its row.

- `Send`, `Delivery`, `Bounce`, `Complaint`, `DeliveryDelay`: SES accepted the entry, so the
  row was sent (a bounce is the mailbox's answer to a mail that went out);
- `Reject`, `Rendering Failure`: SES accepted the call but sent nothing, so the row failed.

SMS (AWS End User Messaging SMS event destinations; the message's context carries `campaign`
and `seq` back the same way):
- `TEXT_DELIVERED`, `TEXT_SUCCESSFUL`: the handset or its carrier took the message, so sent;
- `TEXT_BLOCKED`, `TEXT_CARRIER_BLOCKED`, `TEXT_INVALID`, `TEXT_INVALID_MESSAGE`, `TEXT_SPAM`,
  `TEXT_PROTECT_BLOCKED`, `TEXT_TTL_EXPIRED`, `TEXT_UNREACHABLE`: final failures, so failed;
- `TEXT_QUEUED`, `TEXT_PENDING` (not final yet), `TEXT_CARRIER_UNREACHABLE` (a temporary
  carrier error) and `TEXT_UNKNOWN` (temporary or permanent, AWS cannot say) prove nothing.

A row takes the event's outcome when its own outcome is not known yet:
- `unknown` (lease expired, call timed out, answer unreadable) → reason `resolved_by_event`;
- `sending` (the call's answer is not recorded yet; its worker may be dead, in which case the
  lease would later make the row `unknown`) → reason `event_before_answer`;
- `pending` with reason `resend_unknown` (queued again by an operator; the first send may still
  prove itself) → reason `resolved_by_event`.
A row already `sent` or `failed` keeps its outcome, except that a `Reject` turns a row that
events made `sent` into `failed` (SES publishes `Send` before `Reject`).

Within one batch, one outcome per row: `failed` wins over `sent` (a rejected message has both a
Send and a Reject event), and the earliest event gives the time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

SENT = "sent"
FAILED = "failed"
RESOLVED_BY_EVENT = "resolved_by_event"
EVENT_BEFORE_ANSWER = "event_before_answer"
RESEND_UNKNOWN = "resend_unknown"

# The outcome of the row an event names, by SES or SMS event type; other types (Open, Click,
# Subscription, identity notifications, SMS replies, TEXT_QUEUED …) say nothing about the row.
OUTCOME_BY_EVENT: Mapping[str, str] = {
    "Send": SENT,
    "Delivery": SENT,
    "Bounce": SENT,
    "Complaint": SENT,
    "DeliveryDelay": SENT,
    "Reject": FAILED,
    "Rendering Failure": FAILED,
    "TEXT_DELIVERED": SENT,
    "TEXT_SUCCESSFUL": SENT,
    "TEXT_BLOCKED": FAILED,
    "TEXT_CARRIER_BLOCKED": FAILED,
    "TEXT_INVALID": FAILED,
    "TEXT_INVALID_MESSAGE": FAILED,
    "TEXT_SPAM": FAILED,
    "TEXT_PROTECT_BLOCKED": FAILED,
    "TEXT_TTL_EXPIRED": FAILED,
    "TEXT_UNREACHABLE": FAILED,
}

# Campaign statuses whose unknown rows `resend-unknown` may queue again, and what follows.
RESEND_FROM = {
    "sending": "produced now",
    "paused": "produced when the campaign is resumed",
    "done": "the campaign goes back to sending and they are produced now",
}


class EventProof(NamedTuple):
    """What one SES event proves about one campaign row (a tuple: one per event)."""

    campaign_id: int
    seq: int
    email: str  # normalised; must be the row's address too
    outcome: str  # SENT | FAILED
    ses_message_id: str
    occurred_at_ms: int


def proof_of(record: Mapping[str, Any]) -> EventProof | None:
    """The proof in one decoded `ses_event` record, or None (no campaign/seq tags, or an event
    type that says nothing about delivery)."""
    outcome = OUTCOME_BY_EVENT.get(str(record.get("event_type")))
    campaign, seq = record.get("campaign_id"), record.get("seq")
    if outcome is None or campaign is None or seq is None:
        return None
    if not 0 < int(seq) < 2**31:  # the row key is an int4
        return None
    return EventProof(
        campaign_id=int(campaign),
        seq=int(seq),
        email=str(record["recipient"]),
        outcome=outcome,
        ses_message_id=str(record["ses_message_id"]),
        occurred_at_ms=int(record.get("occurred_at") or 0),
    )


def settle(proofs: Iterable[EventProof]) -> list[EventProof]:
    """One proof per row, in (campaign, seq) order: FAILED over SENT, then the earliest."""
    best: dict[tuple[int, int], EventProof] = {}
    for proof in proofs:
        key = (proof.campaign_id, proof.seq)
        held = best.get(key)
        if held is None or _rank(proof) < _rank(held):
            best[key] = proof
    return [best[key] for key in sorted(best)]


def _rank(proof: EventProof) -> tuple[int, int]:
    return (0 if proof.outcome == FAILED else 1, proof.occurred_at_ms)


def in_doubt_summary(
    by_status_reason: Iterable[tuple[str, str | None, int]], resent: int
) -> dict[str, int]:
    """`campaign report`'s view of the rows in doubt, from its counts per (status, reason)."""
    summary = {
        "resolved_sent": 0,
        "resolved_failed": 0,
        "event_before_answer": 0,
        "still_unknown": 0,
        "queued_again": 0,
        "resent": resent,
    }
    for status, reason, n in by_status_reason:
        if status == "unknown":
            summary["still_unknown"] += n
        elif reason == RESOLVED_BY_EVENT:
            summary["resolved_sent" if status == SENT else "resolved_failed"] += n
        elif reason == EVENT_BEFORE_ANSWER:
            summary["event_before_answer"] += n
        elif reason == RESEND_UNKNOWN:
            summary["queued_again"] += n
    return summary


_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """`90s`, `15m`, `2h`, `1h30m`, `1d` → seconds; ValueError says what is accepted."""
    compact = text.strip().lower().replace(" ", "")
    parts = _DURATION.findall(compact)
    if not compact or "".join(n + u for n, u in parts) != compact:
        raise ValueError(
            f"{text!r} is not a duration: use a number with a unit, e.g. 90s, 15m, 2h, 1h30m, 1d"
        )
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def resend_refusal(campaign_status: str, channel: str = "email") -> str | None:
    """Why the unknown rows of a campaign in this status may not be queued again, or None."""
    if channel == "push":
        # A push row is one user's devices: a call in doubt may have reached some of them,
        # and a resend would notify those twice.
        return (
            "it is a push campaign: an unknown row names several devices, any of which may "
            "have the notification already, so it is not resent"
        )
    if campaign_status in RESEND_FROM:
        return None
    if campaign_status == "cancelled":
        return "it is cancelled: a cancelled campaign sends nothing more"
    return f"it is {campaign_status}: only a sending, paused or done campaign's rows can be resent"
