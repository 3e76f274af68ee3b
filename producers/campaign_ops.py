"""Campaign operations shared by the command line and the lab: create a campaign, pause,
resume or cancel it, and the demo template every local run uses."""

from __future__ import annotations

import time

import psycopg

from flashsend.settings import Settings
from sinks.campaign_store import CampaignStore

DEFAULT_TEMPLATE = "flash_sale"
DEFAULT_SUBJECT = "{{first_name}}, the flash sale starts now"
DEFAULT_HTML = "<p>Hi {{first_name}},</p><p>Everything is 50% off for the next 2 hours.</p>"
DEFAULT_TEXT = "Hi {{first_name}}, everything is 50% off for the next 2 hours."
# The demo template of a campaign with a promo pool: each mail carries its recipient's code.
PROMO_TEMPLATE = "flash_sale_code"
PROMO_SUBJECT = "{{first_name}}, your flash sale code {{promo_code}}"
PROMO_HTML = "<p>Hi {{first_name}},</p><p>Your code <b>{{promo_code}}</b> takes 50% off today.</p>"
PROMO_TEXT = "Hi {{first_name}}, your code {{promo_code}} takes 50% off today."


def create_campaign(
    settings: Settings,
    *,
    name: str,
    template: str = DEFAULT_TEMPLATE,
    rate: float | None = None,
    from_address: str | None = None,
    configuration_set: str | None = None,
    audience: str | None = None,
) -> int:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return CampaignStore(conn).create(
            name=name,
            template=template,
            from_address=from_address or settings.from_address,
            configuration_set=configuration_set or settings.marketing_configuration_set,
            rate_limit=settings.default_rate if rate is None else rate,
            audience_condition=audience or settings.audience_condition,
        )


def control_campaign(settings: Settings, campaign_id: int, action: str, reason: str | None) -> str:
    """`flashsend campaign pause|resume|cancel`: returns once the change is in effect (what
    the command prints)."""
    from streams.campaign_state import POLL_INTERVAL_S

    target = {"pause": "paused", "resume": "sending", "cancel": "cancelled"}[action]
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        CampaignStore(conn).transition(campaign_id, target, reason if target != "sending" else None)
    if target in ("paused", "cancelled"):
        # Workers poll the campaign row every POLL_INTERVAL_S; once that has passed, every
        # lane has seen the new state, so at most the call already in flight completes.
        time.sleep(POLL_INTERVAL_S * 2 + 0.05)
    if target == "sending":
        from producers.reconcile import requeue_after_resume

        requeued = requeue_after_resume(settings, campaign_id)
        return f"campaign {campaign_id} resumed; {requeued:,} pending recipient(s) queued again"
    return f"campaign {campaign_id} {target}"
