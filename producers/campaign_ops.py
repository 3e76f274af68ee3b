"""Campaign operations shared by the command line and the lab: create a campaign (an A/B test
too), pause, resume or cancel it, promote an A/B test's winner, and the demo template every
local run uses."""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg

from flashsend.deliverability import event_types
from flashsend.errors import UsageError
from flashsend.settings import Settings
from sinks.campaign_store import CampaignStore
from sinks.variant_store import VariantStore
from streams.ab_test import DEFAULT_HOLDOUT_WAIT_S, Variant, check_variants, missing_event_type

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
    ab: AbTest | None = None,
    channel: str = "email",
) -> int:
    """A draft campaign; with `ab`, an A/B test (created in one transaction with it). An SMS
    campaign's `template` is its body, its sender the settings' origination identity."""
    if channel not in ("email", "sms"):
        raise UsageError(f"channel must be email or sms, got {channel!r}")
    sms = channel == "sms"
    if sms and ab is not None:
        raise UsageError("an A/B test is not available for SMS campaigns")
    if ab is not None:
        check_variants(ab.variants)
        problem = missing_event_type(ab.winner_by, event_types(settings))
        if problem is not None:
            raise UsageError(problem)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn, conn.transaction():
        cid = CampaignStore(conn).create(
            name=name,
            template=template,
            from_address=from_address
            or (settings.sms_origination_identity if sms else settings.from_address),
            configuration_set=configuration_set
            or (settings.sms_configuration_set if sms else settings.marketing_configuration_set),
            rate_limit=settings.default_rate if rate is None else rate,
            audience_condition=audience or settings.audience_condition,
            channel=channel,
        )
        if ab is not None:
            VariantStore(conn).set_variants(cid, ab.variants, ab.holdout_wait_s, ab.winner_by)
        return cid


@dataclass(frozen=True)
class AbTest:
    """`campaign create --variant … --holdout-wait … --winner-by …`."""

    variants: list[Variant]
    holdout_wait_s: float = DEFAULT_HOLDOUT_WAIT_S
    winner_by: str = "clicks"


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


def promote(settings: Settings, campaign_id: int, variant: str) -> str:
    """`campaign promote`: make `variant` the winner now; the holdout gets its template. When
    the campaign is sending, the released rows are produced before this returns (paused: on
    resume)."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        store = VariantStore(conn)
        state = store.state(campaign_id)
        if state is None:
            raise UsageError(f"campaign {campaign_id} has no variants (create it with --variant)")
        names = [v.name for v in state.variants]
        if variant not in names:
            raise UsageError(f"campaign {campaign_id} has no variant {variant!r}; it has {names}")
        result = store.set_winner(campaign_id, variant, "manual: campaign promote")
        if not result.won:
            now = store.state(campaign_id)
            assert now is not None
            if now.winner is not None:
                raise UsageError(
                    f"campaign {campaign_id} already has a winner: {now.winner} "
                    f"({now.winner_reason}); its holdout got that template"
                )
            raise UsageError(f"campaign {campaign_id} is {now.status}: nothing to promote")
        status = state.status
    produced = 0
    if status == "sending":
        from producers.reconcile import requeue_after_resume

        produced = requeue_after_resume(settings, campaign_id)
    return (
        f"campaign {campaign_id}: {variant} ({state.template_of(variant)}) wins; "
        f"{result.released:,} held recipient(s) released, {produced:,} produced now"
        + ("" if status == "sending" else f" (campaign {status}: produced on resume)")
    )
