"""Campaign operations shared by the command line and the lab: create a campaign (an A/B test
or a scheduled one, or a correction), pause, resume or cancel it, promote an A/B test's
winner, release a seed hold, and the demo template every local run uses."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import psycopg

from flashsend.deliverability import event_types
from flashsend.errors import Conflict, UsageError
from flashsend.settings import Settings
from producers.corrections import check_source_at_create, correction_audience, set_correction_of
from sinks.audit_store import Actor, record
from sinks.campaign_store import CampaignStore
from sinks.queries import query
from sinks.schedule_store import ScheduleStore
from sinks.seed_store import SeedStore
from sinks.variant_store import VariantStore
from streams.rules.ab_test import (
    DEFAULT_HOLDOUT_WAIT_S,
    Variant,
    check_variants,
    missing_event_type,
)
from streams.rules.ramp import RampStep, check_ramp
from streams.rules.send_plan import Schedule, check_schedule, load_zone, sms_schedule

DEFAULT_TEMPLATE = "flash_sale"
DEFAULT_SUBJECT = "{{first_name}}, the flash sale starts now"
DEFAULT_HTML = "<p>Hi {{first_name}},</p><p>Everything is 50% off for the next 2 hours.</p>"
DEFAULT_TEXT = "Hi {{first_name}}, everything is 50% off for the next 2 hours."
# The demo template of a campaign with a promo pool: each mail carries its recipient's code.
PROMO_TEMPLATE = "flash_sale_code"
PROMO_SUBJECT = "{{first_name}}, your flash sale code {{promo_code}}"
PROMO_HTML = "<p>Hi {{first_name}},</p><p>Your code <b>{{promo_code}}</b> takes 50% off today.</p>"
PROMO_TEXT = "Hi {{first_name}}, your code {{promo_code}} takes 50% off today."
# What a campaign's rate limit counts (campaigns.rate_unit): segments only for SMS.
RATE_UNITS = ("messages", "segments")
CHANNELS = ("email", "sms", "push")
PUSH_TITLE = "Flash sale"  # a push campaign's default title (campaigns.from_address)


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
    schedule: Schedule | None = None,
    ramp: Sequence[RampStep] | None = None,
    correction_of: int | None = None,
    channel: str = "email",
    rate_unit: str = "messages",
    actor: Actor | None = None,
    audience_name: str | None = None,
    push_ttl_s: int | None = None,
    push_collapse_key: str | None = None,
) -> int:
    """A draft campaign; with `ab`, an A/B test; with `schedule`, a local-time window or
    engagement waves; with `ramp`, a rate ramp (each stored in one transaction with it). A
    ramp without `rate` takes its highest step as the rate limit, so preflight checks the
    ramp's peak against the account's MaxSendRate. With `correction_of`, a correction of
    that campaign: its audience is the users it sent to, within `audience`
    (producers/corrections.py). An SMS campaign's `template` is its body, its sender the
    settings' origination identity; its `rate` counts messages, or segments with
    `rate_unit="segments"` (each message costs its segments in the lanes' pacing). A push
    campaign's `template` is the notification's body and `from_address` its title; its
    `rate` counts publishes (one per device endpoint), `push_ttl_s` and `push_collapse_key`
    go into every notification."""
    if channel not in CHANNELS:
        raise UsageError(f"channel must be email, sms or push, got {channel!r}")
    sms = channel == "sms"
    push = channel == "push"
    if not push and (push_ttl_s is not None or push_collapse_key):
        raise UsageError("--ttl and --collapse-key are for push campaigns (add --channel push)")
    if push_ttl_s is not None and not 0 <= push_ttl_s <= 2_419_200:
        raise UsageError(f"--ttl must be 0..2419200 seconds (28 days), got {push_ttl_s}")
    if rate_unit not in RATE_UNITS:
        raise UsageError(f"--rate-unit must be messages or segments, got {rate_unit!r}")
    if rate_unit == "segments" and not sms:
        raise UsageError(
            "--rate-unit segments is for SMS campaigns (add --channel sms); an email "
            "campaign's --rate counts recipients"
        )
    if (sms or push) and ab is not None:
        raise UsageError(f"an A/B test is not available for {channel.upper()} campaigns")
    if sms:
        schedule = sms_schedule(settings.sms_send_hours, schedule)
    if push:  # quiet hours as for SMS, with the push notifications' own send hours
        schedule = sms_schedule(settings.push_send_hours, schedule)
    if schedule is not None:
        check_schedule(schedule, has_variants=ab is not None, now=datetime.now(UTC))
        load_zone(settings.default_timezone)  # a bad default zone fails now, not at start
    steps = check_ramp(ramp) if ramp else ()
    if rate is None:
        rate = max(s.rate for s in steps) if steps else settings.default_rate
    if ab is not None:
        check_variants(ab.variants)
        problem = missing_event_type(ab.winner_by, event_types(settings))
        if problem is not None:
            raise UsageError(problem)
    condition = audience or settings.audience_condition
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn, conn.transaction():
        if correction_of is not None:
            check_source_at_create(conn, correction_of)
            condition = correction_audience(correction_of, condition)
        cid = CampaignStore(conn).create(
            name=name,
            template=template,
            from_address=from_address
            or (
                settings.sms_origination_identity
                if sms
                else PUSH_TITLE
                if push
                else settings.from_address
            ),
            configuration_set=None
            if push
            else configuration_set
            or (settings.sms_configuration_set if sms else settings.marketing_configuration_set),
            rate_limit=rate,
            audience_condition=condition,
            channel=channel,
            rate_unit=rate_unit,
        )
        if push:
            conn.execute(
                query("set_push_options"),
                {"id": cid, "ttl_s": push_ttl_s, "collapse_key": push_collapse_key or None},
            )
        if ab is not None:
            VariantStore(conn).set_variants(cid, ab.variants, ab.holdout_wait_s, ab.winner_by)
        if schedule is not None:
            ScheduleStore(conn).set_schedule(cid, schedule)
        if steps:
            conn.execute(
                query("set_campaign_ramp"),
                {"id": cid, "ramp": json.dumps([s.to_dict() for s in steps])},
            )
        if correction_of is not None:
            set_correction_of(conn, cid, correction_of)
        record(
            conn,
            actor,
            "create",
            cid,
            None,
            "draft",
            {
                "name": name,
                "channel": channel,
                **({"audience": audience_name} if audience_name else {}),
            },
        )
        return cid


@dataclass(frozen=True)
class AbTest:
    """`campaign create --variant … --holdout-wait … --winner-by …`."""

    variants: list[Variant]
    holdout_wait_s: float = DEFAULT_HOLDOUT_WAIT_S
    winner_by: str = "clicks"


CONTROL_TARGETS = {"pause": "paused", "resume": "sending", "cancel": "cancelled"}


def control_campaign(
    settings: Settings,
    campaign_id: int,
    action: str,
    reason: str | None,
    actor: Actor | None = None,
) -> str:
    """`flashsend campaign pause|resume|cancel`: returns once the change is in effect (what
    the command prints). Conflict, with the current state, when the campaign is not in a
    state the action moves it from."""
    from streams.campaign_state import POLL_INTERVAL_S

    target = CONTROL_TARGETS[action]
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        CampaignStore(conn).transition(
            campaign_id, target, reason if target != "sending" else None, actor, action
        )
    if target in ("paused", "cancelled"):
        # Workers poll the campaign row every POLL_INTERVAL_S; once that has passed, every
        # lane has seen the new state, so at most the call already in flight completes.
        time.sleep(POLL_INTERVAL_S * 2 + 0.05)
    if target == "sending":
        from producers.reconcile import requeue_after_resume

        requeued = requeue_after_resume(settings, campaign_id)
        return f"campaign {campaign_id} resumed; {requeued:,} pending recipient(s) queued again"
    return f"campaign {campaign_id} {target}"


def promote(settings: Settings, campaign_id: int, variant: str, actor: Actor | None = None) -> str:
    """`campaign promote`: make `variant` the winner now; the holdout gets its template. When
    the campaign is sending, the released rows are produced before this returns (paused: on
    resume)."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        store = VariantStore(conn)
        state = store.state(campaign_id)
        if state is None:
            raise UsageError(f"campaign {campaign_id} has no variants (create it with --variant)")
        hold = SeedStore(conn).state(campaign_id)
        if hold.holding:
            raise UsageError(
                f"campaign {campaign_id} holds for its seed list until {hold.hold_until}: the "
                f"test share has not gone out yet (flashsend campaign release {campaign_id})"
            )
        names = [v.name for v in state.variants]
        if variant not in names:
            raise UsageError(f"campaign {campaign_id} has no variant {variant!r}; it has {names}")
        result = store.set_winner(campaign_id, variant, "manual: campaign promote", actor)
        if not result.won:
            now = store.state(campaign_id)
            assert now is not None
            if now.winner is not None:
                raise Conflict(
                    f"campaign {campaign_id} already has a winner: {now.winner} "
                    f"({now.winner_reason}); its holdout got that template",
                    state=now.status,
                )
            raise Conflict(
                f"campaign {campaign_id} is {now.status}: nothing to promote", state=now.status
            )
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


def release(settings: Settings, campaign_id: int, by: str, actor: Actor | None = None) -> str:
    """`campaign release`: end a seed hold now; the audience is produced before this returns
    when the campaign is sending (paused: on resume)."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        store = SeedStore(conn)
        result = store.release(campaign_id, by, actor)
        state = store.state(campaign_id)
    if not result.freed:
        if state.hold_until is None:
            raise UsageError(f"campaign {campaign_id} has no seed hold (start it with --seed-list)")
        if state.released_at is not None:
            raise Conflict(
                f"campaign {campaign_id}'s hold was released already, at {state.released_at} "
                f"by {state.released_by}",
                state=state.status,
            )
        raise Conflict(
            f"campaign {campaign_id} is {state.status}: nothing to release", state=state.status
        )
    produced = 0
    if state.status == "sending":
        from producers.reconcile import requeue_after_resume

        produced = requeue_after_resume(settings, campaign_id)
    return (
        f"campaign {campaign_id}: hold released by {by}; {result.released:,} held recipient(s) "
        f"released, {produced:,} produced now"
        + ("" if state.status == "sending" else f" (campaign {state.status}: produced on resume)")
    )
