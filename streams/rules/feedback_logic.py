"""What a feedback event means for us, and when a campaign must stop by itself (pure).

Rules (docs/deliverability.md §3, seed 1.7 and case 2):

- a Permanent bounce or a complaint suppresses the address (never mail it again, from any
  campaign); a Transient or Undetermined bounce does not (a full mailbox is not a dead one);
- mailbox-simulator addresses are never suppressed and never counted: SES keeps them out of
  its own reputation metrics, and load tests send to them on purpose;
- counters are per campaign (from the `campaign` tag); mail without one (transactional)
  still feeds the suppression list;
- a campaign pauses itself when, since its last automatic pause, its complaint rate exceeds
  the threshold (default 0.1 %, Gmail's "keep below") or its hard-bounce rate exceeds its
  threshold (default 5 %), once the sample is large enough to trust (default 10,000).

Rates are per message *sent*: SES's own definition. "Sent" is the number of Send events, or
delivered + hard-bounced when that is larger (a configuration set may not publish Send
events; a bounce or a delivery proves the message was sent).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from streams.rules.addresses import is_simulator_address
from streams.rules.field_domains import key_problem, storable_ms_problem, text_problem, uuid_problem
from streams.rules.resolution import EventProof, proof_of

# Counter a feedback event increments, by SES event type.
_COUNTER = {
    "Send": "sent",
    "Delivery": "delivered",
    "Complaint": "complained",
    "Reject": "rejected",
    "DeliveryDelay": "delayed",
    "Rendering Failure": "rendering_failed",
}
COUNTERS = (
    "sent",
    "delivered",
    "bounced",
    "soft_bounced",
    "complained",
    "rejected",
    "delayed",
    "rendering_failed",
    "unsubscribed",
)

# What an A/B test counts per variant (campaign_variant_feedback), by SES event type; Open and
# Click arrive only when the configuration set publishes them (FLASHSEND_SES_EVENT_TYPES).
VARIANT_COUNTERS = ("delivered", "bounced", "complained", "opened", "clicked")
_ENGAGEMENT = {"Open": "opened", "Click": "clicked"}
# What an Open or Click dates on the user behind the mail (users.last_open_at / last_click_at,
# what `--waves` orders the audience by).
ENGAGED = {"Open": "open", "Click": "click"}


class FeedbackEffect(NamedTuple):
    """What one event does: at most one suppression and at most one counter increment (a tuple:
    one is built per event, and a frozen dataclass costs twice as much to build)."""

    event_id: str
    email: str
    campaign_id: int | None
    counter: str | None  # one of COUNTERS, or None (not counted)
    suppress_reason: str | None  # 'bounce' | 'complaint' | None
    source_event: str  # why, for email_suppressions.source_event (audits, support)
    proof: EventProof | None = None  # what the event proves about its campaign row
    variant: str | None = None  # an A/B test's variant (the mail's `variant` tag)
    variant_counter: str | None = None  # one of VARIANT_COUNTERS, or None
    engaged: str | None = None  # 'open' | 'click': dates the user of the row (campaign, seq)
    engaged_seq: int | None = None
    engaged_at_s: float | None = None  # the event's time (epoch seconds), None if unknown


def record_problem(schema: str, record: Mapping[str, Any]) -> tuple[str, str] | None:
    """(reason, detail) when a decoded `ses_event` / `unsubscribed` record has a field outside
    what its effect needs (streams.rules.field_domains: the event id is a uuid key, the address a
    text key, the time becomes a timestamp), else None."""
    problem = uuid_problem(record.get("event_id"))
    if problem is not None:
        return "bad_event_id", problem
    problem = text_problem(record)
    if problem is not None:
        return "bad_text", problem
    address = "recipient" if schema == "ses_event" else "email"
    problem = key_problem(record.get(address))
    if problem is not None:
        return "bad_key", f"{address}: {problem}"
    # The event's time only dates what it proves (sinks/sql/resolution.sql, sent_at): it must
    # be storable; an odd but storable time does not cost a bounce or complaint its effect.
    problem = storable_ms_problem(record.get("occurred_at"))
    if problem is not None:
        return "bad_timestamp", f"occurred_at: {problem}"
    return None


def ses_effect(record: Mapping[str, Any]) -> FeedbackEffect:
    """Effect of one decoded `ses_event` record."""
    email = str(record["recipient"])
    event_type = str(record["event_type"])
    simulator = is_simulator_address(email)
    counter = _COUNTER.get(event_type)
    suppress: str | None = None
    what = event_type
    if event_type == "Bounce":
        bounce_type = record.get("bounce_type") or "Undetermined"
        what = f"Bounce {bounce_type}/{record.get('bounce_sub_type') or '-'}"
        if bounce_type == "Permanent":
            counter, suppress = "bounced", "bounce"
        else:
            counter = "soft_bounced"
    elif event_type == "Complaint":
        suppress = "complaint"
        what = f"Complaint {record.get('complaint_type') or '-'}"
    if simulator:
        counter, suppress = None, None
    campaign = record.get("campaign_id")
    tags = record.get("tags") or {}
    variant = tags.get("variant") if campaign is not None else None
    variant_counter = None
    if variant is not None and not simulator:
        variant_counter = _ENGAGEMENT.get(event_type) or (
            counter if counter in VARIANT_COUNTERS else None
        )
    engaged = None if simulator or campaign is None else ENGAGED.get(event_type)
    seq = record.get("seq")
    if engaged is not None and (seq is None or not 0 < int(seq) < 2**31):
        engaged = None  # no row to find the user by (the row key is an int4)
    occurred_ms = int(record.get("occurred_at") or 0)
    return FeedbackEffect(
        event_id=str(record["event_id"]),
        email=email,
        campaign_id=int(campaign) if campaign is not None else None,
        counter=counter,
        suppress_reason=suppress,
        source_event=f"{what} ses:{record['ses_message_id']}"[:300],
        proof=proof_of(record),
        variant=str(variant)[:64] if variant_counter else None,
        variant_counter=variant_counter,
        engaged=engaged,
        engaged_seq=int(seq) if engaged is not None and seq is not None else None,
        engaged_at_s=occurred_ms / 1000 if engaged is not None and occurred_ms > 0 else None,
    )


def unsubscribe_effect(record: Mapping[str, Any]) -> FeedbackEffect:
    """Effect of one decoded `unsubscribed` record: the opt-out itself is already in
    PostgreSQL (the webhook wrote it before the event existed); only the counter is left."""
    campaign = record.get("campaign_id")
    return FeedbackEffect(
        event_id=str(record["event_id"]),
        email=str(record["email"]),
        campaign_id=int(campaign) if campaign is not None else None,
        counter="unsubscribed",
        suppress_reason=None,
        source_event=f"Unsubscribed user:{record['user_id']}",
    )


@dataclass(frozen=True)
class Thresholds:
    complaint_rate: float = 0.001
    bounce_rate: float = 0.05
    min_sample: int = 10_000

    def __post_init__(self) -> None:
        if not 0 < self.complaint_rate < 1 or not 0 < self.bounce_rate < 1:
            raise ValueError("rate thresholds must be in (0, 1)")
        if self.min_sample < 1:
            raise ValueError("min_sample must be >= 1")


@dataclass(frozen=True)
class Window:
    """Counters of one campaign since its last automatic pause."""

    sent: int
    delivered: int
    bounced: int
    complained: int

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Window:
        """From a campaign_feedback row: totals minus the window base."""
        return cls(
            sent=int(row["sent"]) - int(row["window_sent"]),
            delivered=int(row["delivered"]) - int(row["window_delivered"]),
            bounced=int(row["bounced"]) - int(row["window_bounced"]),
            complained=int(row["complained"]) - int(row["window_complained"]),
        )

    @property
    def base(self) -> int:
        return max(self.sent, self.delivered + self.bounced)


def pause_reason(window: Window, thresholds: Thresholds) -> str | None:
    """Why the campaign must pause now, or None. Strictly above a threshold, and only once
    the sample reaches `min_sample` (ten complaints in the first thousand mails are noise
    with huge error bars; the seed's case 2 waits for 10,000)."""
    base = window.base
    if base < thresholds.min_sample:
        return None
    complaint_rate = window.complained / base
    if complaint_rate > thresholds.complaint_rate:
        return (
            f"auto: complaint rate {complaint_rate:.2%} > {thresholds.complaint_rate:.2%} "
            f"({window.complained:,} of {base:,} sent)"
        )
    bounce_rate = window.bounced / base
    if bounce_rate > thresholds.bounce_rate:
        return (
            f"auto: hard bounce rate {bounce_rate:.2%} > {thresholds.bounce_rate:.2%} "
            f"({window.bounced:,} of {base:,} sent)"
        )
    return None
