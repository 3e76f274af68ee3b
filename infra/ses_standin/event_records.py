"""SES event-publishing records, shaped as the SES developer guide's examples (pure).

One accepted message (a journal `Record`) and its plan (one outcome per recipient) become a
list of `(eventType, event)` pairs: a `Send` for the message, then a `Reject` or a
`Rendering Failure` (and nothing else), or each recipient's events (`Delivery`, `Bounce`,
`Complaint`, `DeliveryDelay`). `mail.tags` carries SES's own `ses:*` tags and the message's
tags as lists of strings (`{"campaign": ["42"], "seq": ["7"]}`), which is how the feedback
path finds the campaign.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from email.utils import parseaddr
from typing import Any

from infra.ses_standin.feedback_plan import (
    BOUNCE,
    OOTO,
    SOFT_BOUNCE,
    SUPPRESSED,
    engagement_types,
    event_types_for,
)

ACCOUNT_ID = "000000000000"
SOURCE_IP = "192.0.2.10"
REPORTING_MTA = "a8-70.smtp-out.amazonses.com"

Event = dict[str, Any]
# (recipient as given in the request, outcome)
Plan = Sequence[tuple[str, str]]

_BOUNCES = {
    BOUNCE: ("Permanent", "General", "5.1.1", "smtp; 550 5.1.1 user unknown"),
    SUPPRESSED: (
        "Permanent",
        "OnAccountSuppressionList",
        "5.1.1",
        "Amazon SES did not send the message to this address because it is on the suppression "
        "list for your account.",
    ),
    SOFT_BOUNCE: ("Transient", "MailboxFull", "4.2.2", "smtp; 452 4.2.2 mailbox full"),
    OOTO: ("Transient", "General", "2.0.0", "smtp; out of the office (automatic reply)"),
}


def iso(t: float | datetime) -> str:
    if isinstance(t, datetime):
        return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    return _iso_epoch(t)


@functools.lru_cache(maxsize=4096)
def _iso_epoch(t: float) -> str:
    # The recipients of one call share its acceptance time: formatted once, not per event.
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@functools.lru_cache(maxsize=1024)
def _bare(address: str) -> str:
    # A campaign's messages share one sender; parsing it costs ~10 µs, a tenth of an event.
    return parseaddr(address)[1] or address


def mail_object(record: dict[str, Any], region: str) -> dict[str, Any]:
    """The `mail` object shared by every event of one message."""
    sender = str(record.get("from", ""))
    domain = _bare(sender).rpartition("@")[2]
    destination = [*record.get("destination", ()), *record.get("cc", ()), *record.get("bcc", ())]
    headers = [
        {"name": "From", "value": sender},
        {"name": "To", "value": ", ".join(record.get("destination", ()))},
        {"name": "Subject", "value": record.get("subject") or ""},
        {"name": "MIME-Version", "value": "1.0"},
        *({"name": str(k), "value": str(v)} for k, v in (record.get("headers") or {}).items()),
    ]
    tags: dict[str, list[str]] = {
        "ses:operation": ["SendBulkEmail" if record.get("operation") == "bulk" else "SendEmail"],
        "ses:source-ip": [SOURCE_IP],
        "ses:from-domain": [domain],
        "ses:caller-identity": ["flashsend-local"],
    }
    if record.get("configuration_set"):
        tags["ses:configuration-set"] = [str(record["configuration_set"])]
    for name, value in (record.get("tags") or {}).items():
        tags[str(name)] = [str(value)]
    return {
        "timestamp": iso(float(record["time"])),
        "source": sender,
        "sourceArn": f"arn:aws:ses:{region}:{ACCOUNT_ID}:identity/{domain}",
        "sendingAccountId": ACCOUNT_ID,
        "messageId": record["message_id"],
        "destination": destination,
        "headersTruncated": False,
        "headers": headers,
        "commonHeaders": {
            "from": [sender],
            "to": list(record.get("destination", ())),
            "messageId": record["message_id"],
            "subject": record.get("subject") or "",
        },
        "tags": tags,
    }


def _recipient_event(
    event_type: str, outcome: str, address: str, mail: dict[str, Any], now: datetime, n: int
) -> Event:
    stamp = iso(now)
    feedback_id = f"{mail['messageId']}-{n:06d}"
    if event_type == "Delivery":
        return {
            "delivery": {
                "timestamp": stamp,
                "processingTimeMillis": 420,
                "recipients": [address],
                "smtpResponse": "250 2.0.0 OK",
                "reportingMTA": REPORTING_MTA,
                "remoteMtaIp": "198.51.100.25",
            }
        }
    if event_type == "Bounce":
        bounce_type, sub_type, status, diagnostic = _BOUNCES[outcome]
        return {
            "bounce": {
                "bounceType": bounce_type,
                "bounceSubType": sub_type,
                "bouncedRecipients": [
                    {
                        "emailAddress": address,
                        "action": "failed" if bounce_type == "Permanent" else "delayed",
                        "status": status,
                        "diagnosticCode": diagnostic,
                    }
                ],
                "timestamp": stamp,
                "feedbackId": feedback_id,
                "reportingMTA": f"dsn; {REPORTING_MTA}",
            }
        }
    if event_type == "Complaint":
        return {
            "complaint": {
                "feedbackId": feedback_id,
                "complaintSubType": None,
                "complainedRecipients": [{"emailAddress": address}],
                "timestamp": stamp,
                "userAgent": "Mozilla/5.0 (flashsend stand-in feedback loop)",
                "complaintFeedbackType": "abuse",
                "arrivalDate": mail["timestamp"],
            }
        }
    if event_type == "DeliveryDelay":
        return {
            "deliveryDelay": {
                "timestamp": stamp,
                "delayType": "MailboxFull",
                "expirationTime": iso(now + timedelta(hours=14)),
                "delayedRecipients": [
                    {
                        "emailAddress": address,
                        "status": "4.2.2",
                        "diagnosticCode": "smtp; 452 4.2.2 mailbox full",
                    }
                ],
                "reportingMTA": REPORTING_MTA,
            }
        }
    if event_type == "Open":
        return {"open": {"ipAddress": "198.51.100.77", "timestamp": stamp, "userAgent": _AGENT}}
    if event_type == "Click":
        return {
            "click": {
                "ipAddress": "198.51.100.77",
                "link": "https://shop.example.com/flash-sale",
                "linkTags": {},
                "timestamp": stamp,
                "userAgent": _AGENT,
            }
        }
    raise ValueError(f"no recipient event {event_type}")


_AGENT = "Mozilla/5.0 (flashsend stand-in engagement)"


def event_types(
    plan: Plan,
    *,
    rejected: bool,
    rendering_failure: bool,
    engaged: Mapping[str, str] | None = None,
) -> list[str]:
    """The event types of one accepted message, in order (what `build_events` builds)."""
    if rejected:
        return ["Send", "Reject"]
    if rendering_failure:
        return ["Send", "Rendering Failure"]
    return [
        "Send",
        *(t for _address, outcome in plan for t in event_types_for(outcome)),
        *(t for e in (engaged or {}).values() for t in engagement_types(e)),
    ]


def build_events(
    record: dict[str, Any],
    plan: Plan,
    *,
    rejected: bool,
    now: datetime,
    region: str = "us-east-1",
    wanted: Collection[str] | None = None,
    engaged: Mapping[str, str] | None = None,
) -> list[tuple[str, Event]]:
    """The events of one accepted message, in the order SES would publish them; only the
    types in `wanted` (None: all) are built — an event destination's matching types.
    `engaged` maps a recipient (as given) to its engagement (feedback_plan.engagement_of):
    its Open / Click events come after every delivery event of the message."""

    def want(event_type: str) -> bool:
        return wanted is None or event_type in wanted

    events: list[tuple[str, Event]] = []
    if not any(want(t) for t in _possible_types(plan, record, rejected, engaged)):
        return events
    mail = mail_object(record, region)
    if want("Send"):
        events.append(("Send", {"eventType": "Send", "mail": mail, "send": {}}))
    if rejected:
        if want("Reject"):
            reject = {"reason": "Bad content"}
            events.append(("Reject", {"eventType": "Reject", "mail": mail, "reject": reject}))
        return events
    failure = record.get("rendering_failure")
    if failure:
        if want("Rendering Failure"):
            detail = {"errorMessage": str(failure), "templateName": record.get("template") or ""}
            events.append(
                (
                    "Rendering Failure",
                    {"eventType": "Rendering Failure", "mail": mail, "failure": detail},
                )
            )
        return events
    n = 0
    for address, outcome in plan:
        for event_type in event_types_for(outcome):
            n += 1  # numbered over all events, built or not: feedback ids do not depend on it
            if not want(event_type):
                continue
            event = {"eventType": event_type, "mail": mail}
            event.update(_recipient_event(event_type, outcome, address, mail, now, n))
            events.append((event_type, event))
    outcomes = dict(plan)
    for address, engagement in (engaged or {}).items():
        for event_type in engagement_types(engagement):
            n += 1
            if not want(event_type):
                continue
            event = {"eventType": event_type, "mail": mail}
            event.update(
                _recipient_event(event_type, outcomes.get(address, ""), address, mail, now, n)
            )
            events.append((event_type, event))
    return events


def _possible_types(
    plan: Plan, record: dict[str, Any], rejected: bool, engaged: Mapping[str, str] | None
) -> list[str]:
    return event_types(
        plan,
        rejected=rejected,
        rendering_failure=bool(record.get("rendering_failure")),
        engaged=engaged,
    )
