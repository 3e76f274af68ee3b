"""`/api/v1/campaigns…`: the campaign commands of the command line over HTTP, through the
same operations (producers/campaign_ops.py, producers/campaign.py): no second path to a
transition. Reads need a viewer key, control an operator key, the rest an admin key."""

from __future__ import annotations

from typing import Annotated, Any

import psycopg
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from psycopg.rows import dict_row

from flashsend.api.auth import Admin, Operator, Viewer
from flashsend.api.campaign_input import create_options, seed_plan
from flashsend.api.models import (
    CampaignControl,
    CampaignCreate,
    CampaignPromote,
    CampaignRelease,
    CampaignStart,
    ResendUnknown,
)
from flashsend.api.problems import ApiProblem, field_error
from flashsend.api.replies import cached_json, idempotent
from flashsend.api.state import ApiState
from flashsend.errors import Conflict
from producers.campaign_ops import control_campaign, create_campaign, promote, release
from sinks.campaign_store import CampaignStore
from sinks.campaign_views import report_view, status_view
from sinks.queries import query

router = APIRouter(prefix="/api/v1/campaigns", tags=["campaigns"])
CampaignId = Annotated[int, Path(ge=1, description="campaign id")]
CONTROL_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "no valid API key"},
    403: {"description": "the key's role may not do this"},
    404: {"description": "no such campaign"},
    409: {"description": "the campaign is in another state (`state`: the current one)"},
    422: {"description": "bad input, naming the field; nothing changed"},
    429: {"description": "over the key's request budget (Retry-After)"},
}


def _state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


def _status(request: Request, campaign_id: int) -> str:
    with _state(request).pool.connection() as conn:
        return CampaignStore(conn).status(campaign_id)


@router.get("", summary="campaigns, newest first")
def list_campaigns(
    request: Request,
    principal: Viewer,
    status: Annotated[str | None, Query(max_length=20)] = None,
    channel: Annotated[str | None, Query(pattern="^(email|sms)$")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    before_id: Annotated[int | None, Query(ge=1, description="next page: next_before_id")] = None,
) -> Response:
    with _state(request).pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        params = {"status": status, "channel": channel, "before_id": before_id, "limit": limit}
        rows = cur.execute(query("list_campaigns"), params).fetchall()
    items = [
        {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in r.items()} for r in rows
    ]
    next_id = items[-1]["id"] if len(items) == limit else None
    return cached_json(request, {"items": items, "next_before_id": next_id})


@router.get("/{campaign_id}", summary="one campaign: what `campaign status --json` shows")
def get_campaign(request: Request, principal: Viewer, campaign_id: CampaignId) -> Response:
    with _state(request).pool.connection() as conn:
        view = status_view(conn, campaign_id)
    view.pop("query_ms", None)  # the read's own timing: it would change the ETag every time
    return cached_json(request, view)


@router.get("/{campaign_id}/report", summary="what `campaign report --json` shows")
def get_report(
    request: Request,
    principal: Viewer,
    campaign_id: CampaignId,
    bucket: Annotated[float, Query(gt=0, le=86400, description="seconds per rate bucket")] = 10.0,
) -> Response:
    with _state(request).pool.connection() as conn:
        return cached_json(request, report_view(conn, campaign_id, bucket))


@router.post("", status_code=201, responses=CONTROL_ERRORS, summary="create a draft campaign")
def create(request: Request, principal: Admin, body: CampaignCreate) -> JSONResponse:
    settings = _state(request).settings

    def operation() -> tuple[int, Any]:
        with _state(request).pool.connection() as conn:
            options = create_options(conn, settings, body)
        cid = create_campaign(settings, actor=principal.actor, **options)
        return 201, {"id": cid, "status": "draft"}

    return idempotent(request, principal, body.model_dump(), operation)


@router.post("/{campaign_id}/start", responses=CONTROL_ERRORS, summary="snapshot and produce")
def start(
    request: Request,
    principal: Operator,
    campaign_id: CampaignId,
    body: CampaignStart | None = None,
) -> JSONResponse:
    from producers.campaign import start_campaign

    body = body or CampaignStart()  # no body: every option at its default
    settings = _state(request).settings
    seeds = seed_plan(body)

    def operation() -> tuple[int, Any]:
        result = start_campaign(
            settings,
            campaign_id,
            ignore_quota=body.ignore_quota,
            spread_over_quota=body.spread_over_quota,
            seeds=seeds,
            actor=principal.actor,
        )
        status = _status(request, campaign_id)
        if result.already_started and status in ("cancelled", "failed"):
            raise Conflict(f"campaign {campaign_id} is {status}: it cannot start", state=status)
        return 200, {**result.__dict__, "status": status, "changed": not result.already_started}

    return idempotent(request, principal, body.model_dump(), operation)


def _control(
    request: Request, principal: Any, campaign_id: int, action: str, body: CampaignControl
) -> JSONResponse:
    settings = _state(request).settings

    def operation() -> tuple[int, Any]:
        reason = body.reason or f"{action} by API key {principal.name}"
        try:
            message = control_campaign(settings, campaign_id, action, reason, principal.actor)
            changed = True
        except Conflict as exc:
            if not (action == "pause" and exc.state == "paused"):
                raise
            message, changed = f"campaign {campaign_id} paused already", False
        status = _status(request, campaign_id)
        return 200, {"id": campaign_id, "status": status, "changed": changed, "message": message}

    return idempotent(request, principal, body.model_dump(), operation)


@router.post("/{campaign_id}/pause", responses=CONTROL_ERRORS, summary="stop SES calls (≤ 1 s)")
def pause(
    request: Request,
    principal: Operator,
    campaign_id: CampaignId,
    body: CampaignControl | None = None,
) -> JSONResponse:
    return _control(request, principal, campaign_id, "pause", body or CampaignControl())


@router.post("/{campaign_id}/resume", responses=CONTROL_ERRORS, summary="continue a paused one")
def resume(
    request: Request,
    principal: Operator,
    campaign_id: CampaignId,
    body: CampaignControl | None = None,
) -> JSONResponse:
    return _control(request, principal, campaign_id, "resume", body or CampaignControl())


@router.post("/{campaign_id}/cancel", responses=CONTROL_ERRORS, summary="cancel pending rows")
def cancel(
    request: Request,
    principal: Operator,
    campaign_id: CampaignId,
    body: CampaignControl | None = None,
) -> JSONResponse:
    return _control(request, principal, campaign_id, "cancel", body or CampaignControl())


@router.post("/{campaign_id}/promote", responses=CONTROL_ERRORS, summary="A/B winner now")
def promote_variant(
    request: Request, principal: Operator, campaign_id: CampaignId, body: CampaignPromote
) -> JSONResponse:
    settings = _state(request).settings

    def operation() -> tuple[int, Any]:
        message = promote(settings, campaign_id, body.variant, principal.actor)
        status = _status(request, campaign_id)
        return 200, {"id": campaign_id, "status": status, "changed": True, "message": message}

    return idempotent(request, principal, body.model_dump(), operation)


@router.post("/{campaign_id}/release", responses=CONTROL_ERRORS, summary="end a seed hold now")
def release_hold(
    request: Request,
    principal: Operator,
    campaign_id: CampaignId,
    body: CampaignRelease | None = None,
) -> JSONResponse:
    settings = _state(request).settings

    given = body or CampaignRelease()

    def operation() -> tuple[int, Any]:
        by = given.by or f"API key {principal.name}"
        message = release(settings, campaign_id, by, principal.actor)
        status = _status(request, campaign_id)
        return 200, {"id": campaign_id, "status": status, "changed": True, "message": message}

    return idempotent(request, principal, given.model_dump(), operation)


@router.post("/{campaign_id}/retire", responses=CONTROL_ERRORS, summary="drop a settled one's rows")
def retire_campaign(request: Request, principal: Admin, campaign_id: CampaignId) -> JSONResponse:
    from sinks.recipient_partitions import retire

    settings = _state(request).settings

    def operation() -> tuple[int, Any]:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            table = retire(conn, campaign_id, principal.actor)
            status = CampaignStore(conn).status(campaign_id)
        return 200, {"id": campaign_id, "status": status, "dropped": table}

    return idempotent(request, principal, {}, operation)


@router.post(
    "/{campaign_id}/resend-unknown",
    responses=CONTROL_ERRORS,
    summary="queue rows still unknown again: a dry run, then apply naming its plan_id",
)
def resend_unknown_rows(
    request: Request, principal: Admin, campaign_id: CampaignId, body: ResendUnknown
) -> JSONResponse:
    from flashsend.api.campaign_input import plan_id
    from producers.resend_unknown import check_feedback_caught_up, plan_resend, resend_unknown
    from streams.rules.resolution import parse_duration

    settings = _state(request).settings
    try:
        older_than_s = parse_duration(body.older_than)
    except ValueError as exc:
        raise field_error("body.older_than", str(exc)) from None

    def operation() -> tuple[int, Any]:
        plan = plan_resend(settings, campaign_id, older_than_s)
        out: dict[str, Any] = {
            "campaign_id": campaign_id,
            "campaign_status": plan.campaign_status,
            "older_than_s": older_than_s,
            "unknown_older": len(plan.rows),
            "plan_id": plan_id(plan),
            "sample": [
                {"seq": r.seq, "user_id": r.user_id, "email": r.email, "reason": r.reason}
                for r in plan.rows[:10]
            ],
            "refusal": plan.refusal,
            "dry_run": body.apply is None,
        }
        if body.apply is None:
            return 200, out
        if body.apply != out["plan_id"]:
            raise ApiProblem(
                409,
                "the rows to resend changed since that dry run: run the dry run again",
                plan_id=out["plan_id"],
            )
        if plan.refusal is not None:
            raise Conflict(f"campaign {campaign_id}: {plan.refusal}", state=plan.campaign_status)
        check_feedback_caught_up(settings)
        out.update(
            resend_unknown(settings, plan, reason=body.reason, actor=principal.actor).as_dict()
        )
        return 200, out

    return idempotent(request, principal, body.model_dump(), operation)
