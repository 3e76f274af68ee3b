"""The platform applications push campaigns publish through, one per platform (FCM, APNs),
and a device's registration: CreatePlatformEndpoint of its token, then its row in
device_endpoints. Delivery failures of both applications go to the first SNS topic of the
settings, which the webhook subscribes (streams.rules.push_feedback reads them)."""

from __future__ import annotations

import psycopg

from flashsend.settings import Settings
from sinks.push import PushSender, make_push_client
from sinks.push_store import register_device

PLATFORMS = ("FCM", "APNS")


def application_names(settings: Settings) -> dict[str, str]:
    return {"FCM": settings.push_application_fcm, "APNS": settings.push_application_apns}


def ensure_applications(settings: Settings, sender: PushSender | None = None) -> dict[str, str]:
    """CreatePlatformApplication for each platform (SNS returns the existing application's ARN
    for a name it knows); platform -> application ARN. Raises sinks.push.PushCallFailed."""
    sender = sender or PushSender(make_push_client(settings, pool=2))
    topic = settings.sns_topic_arns[0] if settings.sns_topic_arns else None
    names = application_names(settings)
    return {p: sender.create_application(names[p], p, topic) for p in PLATFORMS}


def register(
    settings: Settings,
    conn: psycopg.Connection,
    user_id: int,
    platform: str,
    token: str,
    *,
    sender: PushSender | None = None,
    applications: dict[str, str] | None = None,
) -> tuple[int, str]:
    """A device's token for `user_id`: (its row id, its endpoint ARN)."""
    sender = sender or PushSender(make_push_client(settings, pool=2))
    applications = applications or ensure_applications(settings, sender)
    arn = sender.create_endpoint(applications[platform], token, str(user_id))
    return register_device(conn, user_id, platform, token, arn), arn
