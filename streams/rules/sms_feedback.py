"""What an SMS event means for us (pure): an opt-out reply, or the fate of a message we sent.

Two kinds of SMS record reach mail.events (producers.sms_events writes them in the
`ses_event` contract, `source` says which):

- `sms_two_way`: a recipient's reply (AWS End User Messaging SMS two-way messaging, published
  to the phone number's SNS topic). A reply whose first word is one of AWS's default opt-out
  keywords (any case) suppresses the number: `sms_opt_out`, as the start-time sync of the
  opt-out list does, so the next snapshot and the sender's re-check before each call skip it.
  Mail and texts share the suppression table, keyed by the normalised address (a number has no
  `@`, so the two never collide).
- `sms_event_destination`: a TEXT_* event of the configuration set's event destination. It
  names its row through the message's context (`campaign`, `seq`) and settles the row when it
  is still in doubt (streams.rules.resolution: TEXT_DELIVERED / TEXT_SUCCESSFUL prove it sent, a
  permanent failure proves it failed). It counts nowhere and suppresses nothing: a failed
  number may work next month, and STOP is the recipient's own word.

Redelivery changes nothing: the event id is deterministic and the suppression insert keeps the
first reason (sinks/sql/feedback.sql, apply_feedback).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streams.rules.feedback_logic import FeedbackEffect, ses_effect
from streams.rules.push_feedback import is_push, push_effect
from streams.rules.resolution import proof_of

SMS_EVENT_DESTINATION = "sms_event_destination"
SMS_TWO_WAY = "sms_two_way"
SMS_SOURCES = frozenset({SMS_EVENT_DESTINATION, SMS_TWO_WAY})
INBOUND = "SmsInbound"  # our event type for a two-way reply (AWS gives replies no eventType)
SMS_OPT_OUT = "sms_opt_out"

# AWS End User Messaging SMS's required opt-out keywords ("Required opt-out list keywords",
# sms-voice user guide). Keywords are case-insensitive; a reply opts out when it begins with one.
OPT_OUT_KEYWORDS = frozenset(
    {"ARRET", "CANCEL", "END", "OPT-OUT", "OPTOUT", "QUIT", "REMOVE", "STOP", "TD", "UNSUBSCRIBE"}
)


def opt_out_keyword(body: str | None, message_keyword: str | None = None) -> str | None:
    """The opt-out keyword a reply uses (upper case), or None. The reply's first word counts;
    `messageKeyword` (the keyword AWS matched, when it reports one) counts too."""
    for text in (message_keyword, body):
        words = (text or "").split(None, 1)
        if words and words[0].upper() in OPT_OUT_KEYWORDS:
            return words[0].upper()
    return None


def is_sms(record: Mapping[str, Any]) -> bool:
    return record.get("source") in SMS_SOURCES


def sms_effect(record: Mapping[str, Any]) -> FeedbackEffect:
    """Effect of one decoded `ses_event` record that an SMS event became (`is_sms`)."""
    number = str(record["recipient"])
    event_type = str(record["event_type"])
    message_id = str(record["ses_message_id"])
    if event_type == INBOUND:
        keyword = opt_out_keyword(record.get("detail"), (record.get("tags") or {}).get("keyword"))
        return FeedbackEffect(
            event_id=str(record["event_id"]),
            email=number,
            campaign_id=None,
            counter=None,
            suppress_reason=SMS_OPT_OUT if keyword else None,
            source_event=f"{INBOUND} {keyword or '-'} sms:{message_id}"[:300],
        )
    campaign = record.get("campaign_id")
    return FeedbackEffect(
        event_id=str(record["event_id"]),
        email=number,
        campaign_id=int(campaign) if campaign is not None else None,
        counter=None,
        suppress_reason=None,
        source_event=f"{event_type} sms:{message_id}"[:300],
        proof=proof_of(record),
    )


def event_effect(record: Mapping[str, Any]) -> FeedbackEffect:
    """Effect of any decoded `ses_event` record: an SMS event's, a push event's
    (streams.rules.push_feedback), else an SES event's."""
    if is_push(record):
        return push_effect(record)
    return sms_effect(record) if is_sms(record) else ses_effect(record)
