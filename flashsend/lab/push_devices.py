"""The demo's and chaos's devices: users 1..N get 0-3 device endpoints each, registered at the
SNS stand-in and in device_endpoints, with a few of them disabled, so a push run shows every
case a campaign meets.

User u has u % 4 devices (FCM and APNs alternating); in users with devices:
- u % 97 == 1: one endpoint is disabled in our table (the platform said its token was invalid
  in an earlier campaign): skipped at the snapshot; a user whose only device it was is skipped
  `endpoint_disabled:…`;
- u % 101 == 2: the first endpoint is disabled at SNS only (SetEndpointAttributes
  Enabled=false): its publish answers EndpointDisabled, and the channel disables it here;
- u % 211 == 3: the user turned push off (skipped `push_opted_out`).
Registration goes through the stand-in's bulk admin route (tens of thousands of
CreatePlatformEndpoint calls would take minutes); the product's own path is
producers.push_setup.register.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from flashsend.settings import Settings
from infra.ses_standin.admin import SesStandinAdmin
from producers.push_setup import ensure_applications
from sinks.push import PushSender, make_push_client

CHUNK = 5_000


def devices_of(user_id: int) -> list[tuple[str, str]]:
    """(platform, token) of each device of a demo user."""
    return [
        ("FCM" if (user_id + i) % 2 == 0 else "APNS", f"demo-token-{user_id}-{i}")
        for i in range(user_id % 4)
    ]


def seed_devices(settings: Settings, users: int) -> dict[str, Any]:
    """Register the devices of users 1..`users`; returns counts for the run's summary."""
    if not settings.ses_endpoint_url:
        raise RuntimeError("push demo devices need the SES stand-in (it speaks SNS)")
    began = time.monotonic()
    sender = PushSender(make_push_client(settings, pool=4))
    applications = ensure_applications(settings, sender)
    admin = SesStandinAdmin(settings.ses_endpoint_url, timeout=120)
    rows: list[tuple[int, str, str, str, bool, str | None]] = []
    at_sns_only: list[str] = []
    for platform in ("FCM", "APNS"):
        wanted = [(u, t) for u in range(1, users + 1) for p, t in devices_of(u) if p == platform]
        for i in range(0, len(wanted), CHUNK):
            part = wanted[i : i + CHUNK]
            arns = admin.push_register(applications[platform], [t for _, t in part])
            for (u, token), arn in zip(part, arns, strict=True):
                first = token.endswith("-0")
                ours_disabled = u % 97 == 1 and first
                if u % 101 == 2 and first:
                    at_sns_only.append(arn)
                reason = "InvalidPlatformToken" if ours_disabled else None
                rows.append((u, platform, token, arn, not ours_disabled, reason))
    for arn in at_sns_only:
        sender.set_endpoint_attributes(arn, {"Enabled": "false"})
    with psycopg.connect(settings.pg_dsn) as conn, conn.transaction():
        conn.execute("UPDATE users SET push_opt_out = (id %% 211 = 3) WHERE id <= %s", (users,))
        conn.execute(
            "CREATE TEMP TABLE demo_devices (user_id bigint, platform text, token text, "
            "endpoint_arn text, enabled boolean, disabled_reason text) ON COMMIT DROP"
        )
        with conn.cursor().copy(
            "COPY demo_devices (user_id, platform, token, endpoint_arn, enabled, "
            "disabled_reason) FROM STDIN"
        ) as copy:
            for row in rows:
                copy.write_row(row)
        conn.execute(
            "INSERT INTO device_endpoints (user_id, platform, token, endpoint_arn, enabled, "
            "disabled_reason) SELECT user_id, platform, token, endpoint_arn, enabled, "
            "disabled_reason FROM demo_devices "
            "ON CONFLICT (platform, token) DO UPDATE SET user_id = excluded.user_id, "
            "endpoint_arn = excluded.endpoint_arn, enabled = excluded.enabled, "
            "disabled_reason = excluded.disabled_reason, last_seen_at = now()"
        )
    return {
        "devices": len(rows),
        "devices_disabled_here": sum(1 for r in rows if not r[4]),
        "devices_disabled_at_sns": len(at_sns_only),
        "devices_seed_s": round(time.monotonic() - began, 1),
    }


def device_verdict(settings: Settings, campaign_id: int, stats: dict[str, Any]) -> dict[str, Any]:
    """From our rows: how many devices each sent row reached, and the rows skipped with a
    disabled endpoint; from the stand-in: duplicates per device."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE status = 'skipped' AND reason LIKE 'endpoint_%%'),"
            "       count(*) FILTER (WHERE status = 'sent' AND reason LIKE '%%endpoint_%%'),"
            "       count(*) FILTER (WHERE status = 'skipped' AND reason = 'push_opted_out'),"
            "       count(*) FILTER (WHERE status = 'skipped' AND reason = 'no_device'),"
            "       count(*) FILTER (WHERE status = 'skipped' AND reason IS NULL)"
            "  FROM campaign_recipients WHERE campaign_id = %s",
            (campaign_id,),
        ).fetchone()
        disabled_now = conn.execute(
            "SELECT count(*) FROM device_endpoints WHERE NOT enabled"
        ).fetchone()
    assert row is not None and disabled_now is not None
    return {
        "channel": "push",
        "notifications": stats.get("accepted"),
        "devices_notified": stats.get("endpoints"),
        "duplicate_notifications_per_device": stats.get("duplicates"),
        "rows_skipped_endpoint_disabled": row[0],
        "rows_sent_with_a_device_disabled": row[1],
        "rows_skipped_push_opted_out": row[2],
        "rows_skipped_no_device": row[3],
        "rows_skipped_without_reason": row[4],
        "endpoints_disabled_in_table": disabled_now[0],
    }
