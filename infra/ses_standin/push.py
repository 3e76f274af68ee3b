"""The simulated Amazon SNS mobile push account: platform applications, platform endpoints and
publishes to them. No HTTP here (push_routes.py); one asyncio loop, no locks.

Order of checks for Publish to an endpoint ARN: validation (400 InvalidParameter) → unknown
endpoint (404 NotFound) → disabled endpoint (400 EndpointDisabled) → random throttle (`p429`)
→ the account's publish rate `mobile_push_mps` (400 Throttling "Rate exceeded", nothing published)
→ accepted and recorded. A token the platform reports invalid (`invalidate`) is accepted once
more, as SNS accepts a publish before the platform answers: then SNS disables the endpoint
(Enabled=false) and publishes a DeliveryFailure event (FailureType InvalidPlatformToken) to the
application's `EventDeliveryFailure` topic. State lives in memory.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from infra.ses_standin.faults import FaultConfig
from infra.ses_standin.limits import TokenBucket
from infra.ses_standin.stats import max_in_window, sort_points

ARN_PREFIX = "arn:aws:sns:us-east-1:000000000000:"
PLATFORMS = ("GCM", "APNS", "APNS_SANDBOX")
UNTAGGED = "(none)"
MAX_MESSAGE_BYTES = 4096  # a mobile push payload's limit (FCM 4 KB, APNs 4 KB)


class PushError(Exception):
    """An error answer in SNS's query protocol (XML `<Error><Code>`)."""

    def __init__(self, code: str, status: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message


def _invalid(message: str) -> PushError:
    return PushError("InvalidParameter", 400, f"Invalid parameter: {message}")


@dataclass
class Application:
    arn: str
    name: str
    platform: str
    attributes: dict[str, str]


@dataclass
class Endpoint:
    arn: str
    application: str
    token: str
    attributes: dict[str, str]  # Enabled, Token, CustomUserData

    @property
    def enabled(self) -> bool:
        return self.attributes.get("Enabled", "true").lower() == "true"


@dataclass(frozen=True, slots=True)
class PushRecord:
    message_id: str
    at: float
    endpoint_arn: str
    platform: str
    payload: dict[str, Any]  # the platform's own message (the JSON of its key)
    campaign: str
    seq: str


@dataclass
class CampaignLedger:
    """Accepted publishes of one campaign (its payload's `campaign` data)."""

    times: list[float] = field(default_factory=list)
    endpoints: Counter[str] = field(default_factory=Counter)
    users: set[str] = field(default_factory=set)

    def stats(self) -> dict[str, Any]:
        times, counts = sort_points(self.times, [1] * len(self.times))
        dups = [d for d, n in self.endpoints.items() if n > 1]
        return {
            "accepted": len(self.times),
            "notifications": len(self.times),
            "endpoints": len(self.endpoints),
            "duplicates": sum(n - 1 for n in self.endpoints.values() if n > 1),
            "duplicate_endpoints": sorted(dups)[:100],
            "max_1s_window": max_in_window(times, counts),
            "first_ts": times[0] if times else None,
            "last_ts": times[-1] if times else None,
        }


# Called with (event, topic ARN) for each delivery failure: the seam for SNS subscriptions.
EventHook = Callable[[dict[str, Any], str], None]


class PushAccount:
    def __init__(self, config: Callable[[], FaultConfig], draw: Callable[[float], bool]) -> None:
        self._config = config
        self._hit = draw
        self._bucket: TokenBucket | None = None
        self.applications: dict[str, Application] = {}
        self.endpoints: dict[str, Endpoint] = {}
        self._by_token: dict[tuple[str, str], str] = {}  # (application, token) -> endpoint
        self.invalid_tokens: set[str] = set()
        self.ledgers: dict[str, CampaignLedger] = {}
        self.records: list[PushRecord] = []
        self.throttled = 0
        self.refused_disabled = 0
        self.on_event: list[EventHook] = []

    # ---- platform applications and endpoints ----------------------------------------------

    def create_application(self, name: str, platform: str, attributes: dict[str, str]) -> str:
        if platform not in PLATFORMS:
            raise _invalid(f"Platform {platform!r} is not supported here: {PLATFORMS}")
        if not name or len(name) > 256:
            raise _invalid("Name must have 1 to 256 characters")
        arn = f"{ARN_PREFIX}app/{platform}/{name}"
        app = self.applications.get(arn)
        if app is None:
            self.applications[arn] = Application(arn, name, platform, dict(attributes))
        else:
            app.attributes.update(attributes)
        return arn

    def create_endpoint(
        self, application_arn: str, token: str, user_data: str | None, attributes: dict[str, str]
    ) -> str:
        """CreatePlatformEndpoint: idempotent for a token already registered with the same
        attributes (its ARN again), InvalidParameter when they differ, as SNS answers."""
        app = self.applications.get(application_arn)
        if app is None:
            raise PushError("NotFound", 404, "PlatformApplication does not exist")
        if not token or len(token) > 4096:
            raise _invalid("Token must have 1 to 4096 characters")
        wanted = {"Enabled": "true", **attributes, "Token": token}
        if user_data is not None:
            wanted["CustomUserData"] = user_data
        known = self._by_token.get((application_arn, token))
        if known is not None:
            endpoint = self.endpoints[known]
            if any(endpoint.attributes.get(k) != v for k, v in wanted.items()):
                raise _invalid(
                    f"Token Reason: Endpoint {known} already exists with the same Token, "
                    "but different attributes."
                )
            return known
        arn = f"{ARN_PREFIX}endpoint/{app.platform}/{app.name}/{uuid.uuid4()}"
        self.endpoints[arn] = Endpoint(arn, application_arn, token, wanted)
        self._by_token[(application_arn, token)] = arn
        return arn

    def register_enabled(self, application_arn: str, token: str) -> str:
        """The lab's seeding: CreatePlatformEndpoint, or the existing endpoint of the token
        enabled again (as an app re-registering a token would after SetEndpointAttributes)."""
        known = self._by_token.get((application_arn, token))
        if known is not None:
            self.endpoints[known].attributes["Enabled"] = "true"
            return known
        return self.create_endpoint(application_arn, token, None, {})

    def get_attributes(self, arn: str) -> dict[str, str]:
        return dict(self._endpoint(arn).attributes)

    def set_attributes(self, arn: str, attributes: dict[str, str]) -> None:
        endpoint = self._endpoint(arn)
        token = attributes.get("Token")
        if token is not None and token != endpoint.token:
            self._by_token.pop((endpoint.application, endpoint.token), None)
            endpoint.token = token
            self._by_token[(endpoint.application, token)] = arn
        endpoint.attributes.update(attributes)

    def delete_endpoint(self, arn: str) -> None:
        """DeleteEndpoint: succeeds for an endpoint that does not exist, as SNS does."""
        endpoint = self.endpoints.pop(arn, None)
        if endpoint is not None:
            self._by_token.pop((endpoint.application, endpoint.token), None)

    def _endpoint(self, arn: str) -> Endpoint:
        endpoint = self.endpoints.get(arn)
        if endpoint is None:
            raise PushError("NotFound", 404, "Endpoint does not exist")
        return endpoint

    # ---- publish ---------------------------------------------------------------------------

    def publish(self, target: str, message: str, structure: str | None, now: float) -> str:
        """Publish to a platform endpoint: the MessageId, or PushError."""
        if not target:
            raise _invalid("TargetArn or TopicArn or PhoneNumber Reason: no target given")
        payload = _platform_payload(message, structure, self._platform_of(target))
        endpoint = self._endpoint(target)
        if not endpoint.enabled:
            self.refused_disabled += 1
            raise PushError("EndpointDisabled", 400, "Endpoint is disabled")
        config = self._config()
        if self._hit(config.p429) or not self._admit(config.mobile_push_mps, now):
            self.throttled += 1
            raise PushError("Throttling", 400, "Rate exceeded")
        message_id = str(uuid.uuid4())
        data = _data_of(payload)
        campaign = str(data.get("campaign", UNTAGGED))
        record = PushRecord(
            message_id,
            now,
            target,
            self._platform_of(target),
            payload,
            campaign,
            str(data.get("seq", "")),
        )
        self.records.append(record)
        ledger = self.ledgers.setdefault(campaign, CampaignLedger())
        ledger.times.append(now)
        ledger.endpoints[target] += 1
        if endpoint.token in self.invalid_tokens:
            self._fail_delivery(endpoint, message_id, now)
        return message_id

    def _platform_of(self, target: str) -> str:
        app = (
            self.applications.get(self.endpoints[target].application)
            if (target in self.endpoints)
            else None
        )
        return app.platform if app is not None else "GCM"

    def _admit(self, mps: float, now: float) -> bool:
        if self._bucket is None or self._bucket.rate != mps:
            self._bucket = TokenBucket.full(mps, now)
        granted, self._bucket = self._bucket.take(1, now)
        return granted

    def invalidate(self, token: str) -> int:
        """The platform (FCM/APNs) now reports `token` invalid: the next publish to an
        endpoint of it is accepted, then fails. Returns how many endpoints hold the token."""
        self.invalid_tokens.add(token)
        return sum(1 for e in self.endpoints.values() if e.token == token)

    def _fail_delivery(self, endpoint: Endpoint, message_id: str, now: float) -> None:
        """SNS's answer to a platform's "unregistered token": the endpoint is disabled and a
        DeliveryFailure event goes to the application's EventDeliveryFailure topic."""
        endpoint.attributes["Enabled"] = "false"
        app = self.applications[endpoint.application]
        topic = app.attributes.get("EventDeliveryFailure")
        if not topic:
            return
        event = {
            "DeliveryAttempts": 1,
            "EndpointArn": endpoint.arn,
            "EventType": "DeliveryFailure",
            "FailureMessage": "Platform token associated with the endpoint is not valid",
            "FailureType": "InvalidPlatformToken",
            "MessageId": message_id,
            "Resource": app.arn,
            "Service": "SNS",
            "Time": datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds"),
        }
        for hook in self.on_event:
            hook(event, topic)

    # ---- admin -----------------------------------------------------------------------------

    def stats(self, campaign: str | None) -> dict[str, Any]:
        if campaign is not None:
            return self.ledgers.get(campaign, CampaignLedger()).stats()
        total = CampaignLedger()
        for ledger in self.ledgers.values():
            total.times.extend(ledger.times)
            total.endpoints.update(ledger.endpoints)
        return {
            **total.stats(),
            "throttled": self.throttled,
            "refused_disabled": self.refused_disabled,
            "registered_endpoints": len(self.endpoints),
        }

    def messages(self, endpoint: str | None, campaign: str | None) -> list[dict[str, Any]]:
        return [
            {
                "MessageId": r.message_id,
                "at": r.at,
                "endpoint_arn": r.endpoint_arn,
                "platform": r.platform,
                "payload": r.payload,
                "campaign": r.campaign,
                "seq": r.seq,
            }
            for r in self.records
            if (endpoint is None or r.endpoint_arn == endpoint)
            and (campaign is None or r.campaign == campaign)
        ]

    def reset(self) -> None:
        self._bucket = None
        self.ledgers.clear()
        self.records.clear()
        self.throttled = 0
        self.refused_disabled = 0
        self.invalid_tokens.clear()


def _platform_payload(message: str, structure: str | None, platform: str) -> dict[str, Any]:
    """The message the endpoint's platform gets. With MessageStructure=json, SNS wants a JSON
    object with a string `default` and takes the platform's key (GCM, APNS, APNS_SANDBOX),
    itself a JSON string; without it, the text is the notification's body."""
    if len(message.encode()) > MAX_MESSAGE_BYTES:
        raise _invalid("Message too long")
    if structure != "json":
        return {"default": message}
    try:
        doc = json.loads(message)
    except ValueError:
        raise _invalid("Message Structure - No JSON message body is parseable") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("default"), str):
        raise _invalid("Message Structure - No default entry in JSON message body")
    raw = doc.get(platform)
    if raw is None:
        return {"default": doc["default"]}
    if not isinstance(raw, str):
        raise _invalid(f"Message Structure - {platform} must be a JSON string")
    try:
        payload = json.loads(raw)
    except ValueError:
        raise _invalid(f"Message Structure - {platform} is not valid JSON") from None
    if not isinstance(payload, dict):
        raise _invalid(f"Message Structure - {platform} must be a JSON object")
    return payload


def _data_of(payload: dict[str, Any]) -> dict[str, Any]:
    """Our campaign and seq: an FCM payload's `data`, an APNs payload's top-level keys."""
    data = payload.get("data")
    if isinstance(data, dict):
        return data
    return payload
