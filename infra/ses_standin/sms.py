"""The simulated AWS End User Messaging SMS account (`pinpoint-sms-voice-v2`): limits, the
opt-out list and accepted messages. No HTTP here (sms_routes.py); one asyncio loop, no locks.

Order of checks for SendTextMessage: validation (400 ValidationException) → sending disabled
(403 AccessDeniedException ACCOUNT_DISABLED) → opted-out destination (400 ConflictException
DESTINATION_PHONE_NUMBER_OPTED_OUT) → random throttle (`p429`) → the origination identity's
MPS (400 ThrottlingException, nothing sent) → the month's spend limit (402
ServiceQuotaExceededException MONTHLY_SPEND_LIMIT_REACHED_FOR_TEXT) → accepted and recorded.
State lives in memory: a restart of the stand-in forgets it (the email journal does not).
"""

from __future__ import annotations

import json
import re
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from infra.ses_standin.faults import FaultConfig
from infra.ses_standin.limits import TokenBucket
from infra.ses_standin.stats import max_in_window, sort_points
from streams.rules.sms_feedback import opt_out_keyword
from streams.rules.sms_text import count_segments

# What one segment costs (USD), for the spend limit: a flat price, the US rate's order.
SEGMENT_PRICE_USD = 0.00581
DEFAULT_OPT_OUT_LIST = "Default"
_E164 = re.compile(r"\+[1-9][0-9]{7,14}")
_IDENTITY = re.compile(r"[A-Za-z0-9_:/\+-]{1,256}")
UNTAGGED = "(none)"


class SmsError(Exception):
    """An error answer in the JSON 1.0 protocol: `__type` names the modeled shape."""

    def __init__(self, code: str, status: int, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message
        self.reason = reason

    def body(self) -> bytes:
        doc: dict[str, Any] = {"__type": self.code, "Message": self.message}
        if self.reason:
            doc["Reason"] = self.reason
        return json.dumps(doc).encode()


def _invalid(message: str, reason: str = "INVALID_PARAMETER") -> SmsError:
    return SmsError("ValidationException", 400, message, reason)


@dataclass
class CampaignLedger:
    """Accepted messages of one campaign (its `Context.campaign`)."""

    times: list[float] = field(default_factory=list)
    segment_counts: list[int] = field(default_factory=list)  # of each message, as `times`
    destinations: Counter[str] = field(default_factory=Counter)
    segments: int = 0

    def stats(self) -> dict[str, Any]:
        times, counts = sort_points(self.times, [1] * len(self.times))
        _, segments = sort_points(self.times, self.segment_counts)
        dups = [d for d, n in self.destinations.items() if n > 1]
        return {
            "accepted": len(self.times),
            "messages": len(self.times),
            "duplicates": sum(n - 1 for n in self.destinations.values() if n > 1),
            "duplicate_destinations": sorted(dups)[:100],
            "max_1s_window": max_in_window(times, counts),
            "max_1s_window_segments": max_in_window(times, segments),
            "segments": self.segments,
            "first_ts": times[0] if times else None,
            "last_ts": times[-1] if times else None,
        }


@dataclass(frozen=True, slots=True)
class SmsRecord:
    message_id: str
    at: float
    destination: str
    origination_identity: str
    body: str
    segments: int
    context: dict[str, str]
    configuration_set: str | None = None


# Called once per accepted message: the seam for the configuration set's event destination.
TextHook = Callable[[SmsRecord], None]
# Called once per reply to a number with two-way messaging on: (payload, the number's topic).
InboundHook = Callable[[dict[str, Any], str], None]


class SmsAccount:
    def __init__(self, config: Callable[[], FaultConfig], draw: Callable[[float], bool]) -> None:
        self._config = config
        self._hit = draw
        self._buckets: dict[str, TokenBucket] = {}
        self.opted_out: dict[str, dict[str, float]] = {DEFAULT_OPT_OUT_LIST: {}}
        self.ledgers: dict[str, CampaignLedger] = {}
        self.records: list[SmsRecord] = []
        self.spent_usd = 0.0
        self.throttled = 0
        self.two_way: dict[str, str] = {}  # phone number -> its two-way channel (SNS topic ARN)
        self.on_text: list[TextHook] = []
        self.on_inbound: list[InboundHook] = []

    def send_text(self, body: dict[str, Any], now: float) -> str:
        """SendTextMessage: the MessageId, or SmsError."""
        destination = body.get("DestinationPhoneNumber")
        if not isinstance(destination, str) or _E164.fullmatch(destination) is None:
            raise _invalid(f"DestinationPhoneNumber {destination!r} is not an E.164 number.")
        identity = body.get("OriginationIdentity") or "default"
        if not isinstance(identity, str) or _IDENTITY.fullmatch(identity) is None:
            raise _invalid("OriginationIdentity is not valid.")
        text = body.get("MessageBody")
        if not isinstance(text, str) or not text.strip() or len(text) > 1600:
            raise _invalid("MessageBody must have 1 to 1600 characters.")
        if body.get("MessageType", "PROMOTIONAL") not in ("TRANSACTIONAL", "PROMOTIONAL"):
            raise _invalid("MessageType must be TRANSACTIONAL or PROMOTIONAL.")
        context = body.get("Context") or {}
        if not isinstance(context, dict) or len(context) > 5:
            raise _invalid("Context holds at most 5 entries.")
        config = self._config()
        if not config.sending_enabled:
            raise SmsError("AccessDeniedException", 403, "Account disabled.", "ACCOUNT_DISABLED")
        if destination in self.opted_out[DEFAULT_OPT_OUT_LIST]:
            raise SmsError(
                "ConflictException",
                400,
                f"{destination} is opted out.",
                "DESTINATION_PHONE_NUMBER_OPTED_OUT",
            )
        if self._hit(config.p429) or not self._admit(identity, config.sms_mps, now):
            self.throttled += 1
            raise SmsError("ThrottlingException", 400, "Rate exceeded.")
        segments = count_segments(text).count
        cost = segments * SEGMENT_PRICE_USD
        limit = config.sms_monthly_spend_usd
        if limit > 0 and self.spent_usd + cost > limit:
            raise SmsError(
                "ServiceQuotaExceededException",
                402,
                "Monthly spend limit reached.",
                "MONTHLY_SPEND_LIMIT_REACHED_FOR_TEXT",
            )
        self.spent_usd += cost
        message_id = str(uuid.uuid4())
        ctx = {str(k): str(v) for k, v in context.items()}
        configuration_set = body.get("ConfigurationSetName")
        record = SmsRecord(
            message_id,
            now,
            destination,
            identity,
            text,
            segments,
            ctx,
            configuration_set if isinstance(configuration_set, str) and configuration_set else None,
        )
        self.records.append(record)
        for hook in self.on_text:
            hook(record)
        ledger = self.ledgers.setdefault(ctx.get("campaign", UNTAGGED), CampaignLedger())
        ledger.times.append(now)
        ledger.segment_counts.append(segments)
        ledger.destinations[destination] += 1
        ledger.segments += segments
        return message_id

    def _admit(self, identity: str, mps: float, now: float) -> bool:
        bucket = self._buckets.get(identity)
        if bucket is None or bucket.rate != mps:
            bucket = TokenBucket.full(mps, now)
        granted, self._buckets[identity] = bucket.take(1, now)
        return granted

    def put_opted_out(self, list_name: str, number: str, now: float) -> dict[str, Any]:
        if _E164.fullmatch(number) is None:
            raise _invalid(f"OptedOutNumber {number!r} is not an E.164 number.")
        numbers = self._list(list_name)
        numbers.setdefault(number, now)
        return {
            "OptOutListArn": _arn(list_name),
            "OptOutListName": list_name,
            "OptedOutNumber": number,
            "OptedOutTimestamp": numbers[number],
            "EndUserOptedOut": False,
        }

    def describe_opted_out(self, body: dict[str, Any]) -> dict[str, Any]:
        name = str(body.get("OptOutListName") or "")
        numbers = self._list(name)
        wanted = body.get("OptedOutNumbers")
        items = sorted(numbers.items())
        if isinstance(wanted, list):
            items = [(n, t) for n, t in items if n in wanted]
        size = int(body.get("MaxResults") or 100)
        start = int(body.get("NextToken") or 0)
        page = items[start : start + size]
        answer: dict[str, Any] = {
            "OptOutListArn": _arn(name),
            "OptOutListName": name,
            "OptedOutNumbers": [
                {"OptedOutNumber": n, "OptedOutTimestamp": t, "EndUserOptedOut": True}
                for n, t in page
            ],
        }
        if start + size < len(items):
            answer["NextToken"] = str(start + size)
        return answer

    def update_phone_number(self, body: dict[str, Any]) -> dict[str, Any]:
        """UpdatePhoneNumber's two-way settings: replies to the number go to the SNS topic
        `TwoWayChannelArn` while `TwoWayEnabled`. The stand-in's numbers are their own ids."""
        number = str(body.get("PhoneNumberId") or "")
        if _E164.fullmatch(number) is None:
            raise SmsError("ResourceNotFoundException", 404, f"Phone number {number!r} not found.")
        if "TwoWayEnabled" in body:
            channel = body.get("TwoWayChannelArn") or self.two_way.get(number)
            if body["TwoWayEnabled"]:
                if not isinstance(channel, str) or not channel.startswith("arn:aws:sns:"):
                    raise _invalid("TwoWayChannelArn must be an SNS topic ARN.")
                self.two_way[number] = channel
            else:
                self.two_way.pop(number, None)
        enabled = number in self.two_way
        answer: dict[str, Any] = {
            "PhoneNumberArn": f"arn:aws:sms-voice:us-east-1:000000000000:phone-number/{number}",
            "PhoneNumberId": number,
            "PhoneNumber": number,
            "Status": "ACTIVE",
            "TwoWayEnabled": enabled,
            "SelfManagedOptOutsEnabled": False,
            "OptOutListName": DEFAULT_OPT_OUT_LIST,
        }
        if enabled:
            answer["TwoWayChannelArn"] = self.two_way[number]
        return answer

    def inbound(self, origin: str, destination: str, text: str, now: float) -> dict[str, Any]:
        """A recipient's reply. One that begins with an opt-out keyword (any case) puts the
        number on the default opt-out list, as the service does. With two-way messaging on
        for `destination`, the reply goes to its SNS topic as the service's payload
        (`messageKeyword` is the opt-out keyword it matched, else empty). The answer is that
        payload plus `optedOut` and `publishedTo` (the topic, or None)."""
        keyword = opt_out_keyword(text)
        if keyword is not None:
            self.opted_out[DEFAULT_OPT_OUT_LIST].setdefault(origin, now)
        payload = {
            "originationNumber": origin,
            "destinationNumber": destination,
            "messageKeyword": keyword or "",
            "messageBody": text,
            "inboundMessageId": str(uuid.uuid4()),
        }
        topic = self.two_way.get(destination)
        if topic is not None:
            for hook in self.on_inbound:
                hook(payload, topic)
        return {**payload, "optedOut": keyword is not None, "publishedTo": topic}

    def stats(self, campaign: str | None) -> dict[str, Any]:
        if campaign is not None:
            return self.ledgers.get(campaign, CampaignLedger()).stats()
        total = CampaignLedger()
        for ledger in self.ledgers.values():
            total.times.extend(ledger.times)
            total.segment_counts.extend(ledger.segment_counts)
            total.destinations.update(ledger.destinations)
            total.segments += ledger.segments
        return {**total.stats(), "spent_usd": round(self.spent_usd, 5), "throttled": self.throttled}

    def messages(self, destination: str | None, campaign: str | None) -> list[dict[str, Any]]:
        return [
            {
                "MessageId": r.message_id,
                "at": r.at,
                "destination": r.destination,
                "origination_identity": r.origination_identity,
                "body": r.body,
                "segments": r.segments,
                "context": r.context,
            }
            for r in self.records
            if (destination is None or r.destination == destination)
            and (campaign is None or r.context.get("campaign") == campaign)
        ]

    def reset(self) -> None:
        self._buckets.clear()
        self.opted_out = {DEFAULT_OPT_OUT_LIST: {}}
        self.ledgers.clear()
        self.records.clear()
        self.spent_usd = 0.0
        self.throttled = 0
        self.two_way.clear()

    def _list(self, name: str) -> dict[str, float]:
        if name not in self.opted_out:
            raise SmsError(
                "ResourceNotFoundException", 404, f"Opt-out list {name!r} does not exist."
            )
        return self.opted_out[name]


def _arn(name: str) -> str:
    return f"arn:aws:sms-voice:us-east-1:000000000000:opt-out-list/{name}"
