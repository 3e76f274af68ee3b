"""A request body → the operation's arguments, each mistake a 422 naming its field (and
nothing written): the command line's own parsers, field by field."""

from __future__ import annotations

import hashlib
from typing import Any

import psycopg

from flashsend.api.models import CampaignCreate, CampaignStart
from flashsend.api.problems import ApiProblem, field_error
from flashsend.errors import UsageError
from flashsend.settings import Settings
from producers.campaign_ops import DEFAULT_TEMPLATE, AbTest
from sinks.api_key_store import ApiKeyStore
from sinks.resolution_store import ResendPlan
from sinks.seed_store import SeedPlan
from streams.rules.ab_test import check_variants, parse_duration, parse_variant
from streams.rules.ramp import parse_ramp
from streams.rules.seed_list import DEFAULT_HOLD_S, parse_seed_list
from streams.rules.send_plan import schedule_from_flags


def _field(field: str, exc: Exception) -> ApiProblem:
    return field_error(f"body.{field}", str(exc))


def create_options(
    conn: psycopg.Connection[Any], settings: Settings, body: CampaignCreate
) -> dict[str, Any]:
    """Keyword arguments of create_campaign (everything but the actor)."""
    audience = None
    if body.audience is not None:
        audience = ApiKeyStore(conn).audience(body.audience)
        if audience is None:
            raise field_error(
                "body.audience",
                f"no audience named {body.audience!r}; an admin registers one "
                "(flashsend audience add NAME --where SQL, or POST /api/v1/audiences)",
            )
    texted = body.channel in ("sms", "push")
    if texted and not body.body:
        raise field_error("body.body", f"a {body.channel} campaign needs its message")
    if not texted and body.body:
        raise field_error("body.body", "body is the text of an SMS or push campaign")
    if texted and body.template:
        raise field_error("body.template", f"a {body.channel} campaign has a body, not a template")
    for field in ("ttl_s", "collapse_key"):
        if body.channel != "push" and getattr(body, field) is not None:
            raise field_error(f"body.{field}", "for push campaigns (channel push)")
    ab = None
    if body.variants:
        try:
            variants = check_variants([parse_variant(v) for v in body.variants])
        except UsageError as exc:
            raise _field("variants", exc) from None
        try:
            wait = parse_duration(body.holdout_wait)
        except UsageError as exc:
            raise _field("holdout_wait", exc) from None
        ab = AbTest(variants=variants, holdout_wait_s=wait, winner_by=body.winner_by)
    try:
        schedule = schedule_from_flags(body.local_window, body.date, body.waves)
    except UsageError as exc:
        field = "waves" if body.waves and not body.local_window else "local_window"
        raise _field(field, exc) from None
    try:
        ramp = parse_ramp(body.ramp) if body.ramp is not None else None
    except UsageError as exc:
        raise _field("ramp", exc) from None
    return {
        "name": body.name,
        "template": body.body if texted else (body.template or DEFAULT_TEMPLATE),
        "channel": body.channel,
        "rate_unit": body.rate_unit,
        "rate": body.rate,
        "from_address": body.from_address,
        "configuration_set": body.configuration_set,
        "audience": audience,
        "audience_name": body.audience,
        "ab": ab,
        "schedule": schedule,
        "ramp": ramp,
        "correction_of": body.correction_of,
        "push_ttl_s": body.ttl_s,
        "push_collapse_key": body.collapse_key,
    }


def seed_plan(body: CampaignStart) -> SeedPlan | None:
    if body.seed_list is None:
        if body.hold is not None:
            raise field_error("body.hold", "needs seed_list (the addresses that go first)")
        return None
    try:
        emails = parse_seed_list(body.seed_list, "seed_list")
    except UsageError as exc:
        raise _field("seed_list", exc) from None
    try:
        hold = DEFAULT_HOLD_S if body.hold is None else parse_duration(body.hold)
    except UsageError as exc:
        raise _field("hold", exc) from None
    return SeedPlan(emails, hold)


def plan_id(plan: ResendPlan) -> str:
    """Names a resend-unknown dry run: the campaign, the grace and exactly its rows."""
    seqs = ",".join(str(r.seq) for r in sorted(plan.rows, key=lambda r: r.seq))
    text = f"{plan.campaign_id}:{plan.older_than_s!r}:{seqs}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]
