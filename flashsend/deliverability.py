"""Deliverability settings derived from `Settings`, in one place.

Production trusts only AWS: SigningCertURL and SubscribeURL on `sns.<region>.amazonaws.com`
over https, and the TopicArns listed in `sns_topic_arns`. The local stack signs with its own
key: when SES is the local stand-in (`ses_endpoint` set), the webhook accepts certificates
served over http by exactly the stand-in's host:port (or `sns_cert_authority`), nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Protocol
from urllib.parse import urlsplit

from flashsend.errors import UsageError
from flashsend.settings import LOCAL_FIREHOSE_ACCESS_KEY, LOCAL_UNSUBSCRIBE_KEYS, Settings
from producers.sns_verify import HttpsCertificateSource, VerifierPolicy
from streams.rules.feedback_logic import Thresholds
from streams.rules.unsubscribe_token import TokenKeys, make_token, parse_keys, unsubscribe_url

SNS_PATH = "/sns"
FIREHOSE_PATH = "/firehose"

# SES event type as it reaches the webhook (`eventType`) → SESv2 MatchingEventTypes name.
SES_EVENT_TYPES = {
    "Send": "SEND",
    "Reject": "REJECT",
    "Bounce": "BOUNCE",
    "Complaint": "COMPLAINT",
    "Delivery": "DELIVERY",
    "Open": "OPEN",
    "Click": "CLICK",
    "Rendering Failure": "RENDERING_FAILURE",
    "DeliveryDelay": "DELIVERY_DELAY",
    "Subscription": "SUBSCRIPTION",
}


class DeliverabilityConfigError(UsageError):
    """The deliverability settings are unsafe or inconsistent."""


def is_local(settings: Settings) -> bool:
    """True when SES is not real Amazon SES (the stand-in or another local endpoint)."""
    return settings.ses_endpoint_url is not None


def cert_authority(settings: Settings) -> str | None:
    """host:port whose http certificates the webhook trusts, or None (AWS hosts only)."""
    if settings.sns_cert_authority:
        return settings.sns_cert_authority
    if settings.ses_endpoint_url:
        return urlsplit(settings.ses_endpoint_url).netloc
    return None


def verifier_policy(settings: Settings) -> VerifierPolicy:
    topics = frozenset(settings.sns_topic_arns)
    if not topics:
        raise DeliverabilityConfigError("FLASHSEND_SNS_TOPIC_ARNS lists no topic")
    authority = cert_authority(settings)
    if authority is None:
        return VerifierPolicy(topics)
    return VerifierPolicy.for_local(topics, authority)


def certificate_source(settings: Settings) -> HttpsCertificateSource:
    return HttpsCertificateSource(allow_http=cert_authority(settings) is not None)


def webhook_processes(settings: Settings, cpus: int | None = None) -> int:
    """How many webhook processes to run: the setting, or half the CPUs (at least one)."""
    if settings.webhook_processes < 0:
        raise DeliverabilityConfigError("FLASHSEND_WEBHOOK_PROCESSES must be 0 (auto) or more")
    if settings.webhook_processes:
        return settings.webhook_processes
    return max(1, (cpus or os.cpu_count() or 1) // 2)


def event_types(settings: Settings) -> tuple[str, ...]:
    """The event types an event destination publishes (`ses_event_types`), checked."""
    unknown = [t for t in settings.ses_event_types if t not in SES_EVENT_TYPES]
    if unknown or not settings.ses_event_types:
        raise DeliverabilityConfigError(
            f"FLASHSEND_SES_EVENT_TYPES: {unknown or 'empty'}; known: {list(SES_EVENT_TYPES)}"
        )
    return settings.ses_event_types


def matching_event_types(settings: Settings) -> list[str]:
    """`event_types` as SESv2 CreateConfigurationSetEventDestination's MatchingEventTypes."""
    return [SES_EVENT_TYPES[t] for t in event_types(settings)]


def firehose_access_keys(settings: Settings) -> tuple[str, ...]:
    """The access keys a Firehose delivery stream may present (FLASHSEND_FIREHOSE_ACCESS_KEYS,
    comma-separated); none configured: the /firehose route refuses every request. The
    well-known local key is refused with real Amazon SES."""
    spec = settings.firehose_access_keys.get_secret_value()
    keys = tuple(key.strip() for key in spec.split(",") if key.strip())
    if LOCAL_FIREHOSE_ACCESS_KEY in keys and not is_local(settings):
        raise DeliverabilityConfigError(
            "FLASHSEND_FIREHOSE_ACCESS_KEYS still holds the local development key: anyone could "
            "post SES events to your webhook. Set it to a secret (`openssl rand -hex 32`)"
        )
    return keys


def token_keys(settings: Settings) -> TokenKeys:
    """Unsubscribe token keys; the well-known local key is refused with real Amazon SES."""
    spec = settings.unsubscribe_keys.get_secret_value()
    if not is_local(settings) and LOCAL_UNSUBSCRIBE_KEYS.split(":", 1)[1] in spec:
        raise DeliverabilityConfigError(
            "FLASHSEND_UNSUBSCRIBE_KEYS still holds the local development key: anyone could "
            "unsubscribe your users. Set it to `kid:<openssl rand -base64 32>`"
        )
    try:
        return parse_keys(spec)
    except ValueError as exc:
        raise DeliverabilityConfigError(f"FLASHSEND_UNSUBSCRIBE_KEYS: {exc}") from exc


def public_url(settings: Settings) -> str:
    """Base of the webhook as mailbox providers and SNS reach it."""
    return (settings.webhook_public_url or f"http://127.0.0.1:{settings.webhook_port}").rstrip("/")


def allow_http_links(settings: Settings) -> bool:
    """http List-Unsubscribe URLs only on the local stack (Gmail ignores non-https ones)."""
    return is_local(settings) and public_url(settings).startswith("http://")


def feedback_app_id(settings: Settings) -> str:
    return settings.feedback_app_id or f"{settings.app_id}-feedback"


def thresholds(settings: Settings) -> Thresholds:
    return Thresholds(
        complaint_rate=settings.feedback_complaint_threshold,
        bounce_rate=settings.feedback_bounce_threshold,
        min_sample=settings.feedback_min_sample,
    )


def check_separation(settings: Settings) -> None:
    """Marketing and transactional mail must not share a configuration set: each has its own
    event destination and its own reputation metrics (seed 1.8 / case 3)."""
    marketing = settings.marketing_configuration_set
    if marketing and marketing == settings.transactional_configuration_set:
        raise DeliverabilityConfigError(
            f"marketing and transactional mail share the configuration set {marketing!r}: "
            "give each its own (FLASHSEND_MARKETING_CONFIGURATION_SET)"
        )


POST_HEADER = "List-Unsubscribe=One-Click"


class Addressed(Protocol):
    """What an unsubscribe link names: a claimed recipient row, seen from the ground."""

    @property
    def user_id(self) -> int: ...

    @property
    def campaign_id(self) -> int: ...


def unsubscribe_headers(settings: Settings) -> Callable[[Addressed], Mapping[str, str]]:
    """The campaign sender's `headers_for`: RFC 8058 headers on every marketing message —
    `List-Unsubscribe: <https://…/u/TOKEN>` (TOKEN signs user and campaign with the current key)
    and `List-Unsubscribe-Post: List-Unsubscribe=One-Click`, as SES ReplacementHeaders. Gmail and
    Yahoo require both from bulk senders. The URL prefix is validated here, once, when the
    sender starts: a bad `webhook_public_url` stops the worker instead of mailing a million
    broken links."""
    keys = token_keys(settings)
    base = public_url(settings)
    sample = make_token(keys, 0, 0)
    prefix = unsubscribe_url(base, sample, allow_http=allow_http_links(settings)).removesuffix(
        sample
    )

    def headers_for(row: Addressed) -> Mapping[str, str]:
        # A seed (user id < 0, streams/rules/seed_list.py) has no user: its link is user 0's, a
        # working one-click that opts nobody out, so the seed inbox sees the real headers.
        token = make_token(keys, max(row.user_id, 0), row.campaign_id)
        return {"List-Unsubscribe": f"<{prefix}{token}>", "List-Unsubscribe-Post": POST_HEADER}

    return headers_for
