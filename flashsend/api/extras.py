"""Templates (`/api/v1/templates`), promo pools (`/api/v1/campaigns/{id}/promo-codes`) and dead
letters (`/api/v1/dead-letters`): the `template`, `promo` and `dlq` commands over HTTP."""

from __future__ import annotations

from typing import Annotated, Any

import psycopg
from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import JSONResponse, Response

from flashsend.api.auth import Admin, Viewer
from flashsend.api.models import PromoGenerate, PromoImport, SuppressionChange, TemplatePut
from flashsend.api.problems import ApiProblem, field_error
from flashsend.api.replies import cached_json, idempotent
from flashsend.api.state import ApiState
from sinks.audit_store import record
from sinks.promo_store import PromoStore
from sinks.suppression_store import SuppressionStore
from streams.rules.promo_codes import (
    PatternError,
    PoolFileError,
    check_count,
    parse_pattern,
    read_pool_file,
)

router = APIRouter(prefix="/api/v1", tags=["templates, promo codes, suppressions, dead letters"])
TemplateName = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
CampaignId = Annotated[int, Path(ge=1)]


def _state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


def _ses(request: Request) -> Any:
    from sinks.ses import SesSender, make_client

    return SesSender(make_client(_state(request).settings, timeout=10))


@router.get("/templates", summary="SES templates")
def list_templates(request: Request, principal: Viewer) -> Response:
    return cached_json(request, {"items": _ses(request).list_templates(limit=1000)})


@router.get("/templates/{name}", summary="one SES template")
def get_template(request: Request, principal: Viewer, name: TemplateName) -> Response:
    template = _ses(request).get_template(name)
    if template is None:
        raise ApiProblem(404, f"SES has no template {name!r}")
    return cached_json(request, template)


def preview_data(first_name: str | None, user_id: int) -> dict[str, Any]:
    """The values the sender gives one recipient (streams.sender.replacement_data); a
    campaign with a promo pool adds the code bound at the claim, shown here as a sample."""
    return {"first_name": first_name or "there", "user_id": user_id, "promo_code": "SAMPLE-CODE"}


@router.get(
    "/templates/{name}/preview",
    summary="the template as SES renders it for one user (subject, text, html)",
)
def preview_template(
    request: Request,
    principal: Admin,
    name: TemplateName,
    user_id: Annotated[int, Query(ge=1, description="the user whose values fill it")],
) -> Response:
    import email
    import email.policy

    with _state(request).pool.connection() as conn:
        row = conn.execute("SELECT first_name FROM users WHERE id = %s", (user_id,)).fetchone()
    if row is None:
        raise field_error("query.user_id", f"no user {user_id}")
    rendered = _ses(request).render_template(name, preview_data(row[0], user_id))
    if rendered is None:
        raise ApiProblem(404, f"SES has no template {name!r}")
    message = email.message_from_string(rendered, policy=email.policy.default)
    parts: dict[str, str | None] = {}
    for kind in ("plain", "html"):
        part = message.get_body(preferencelist=(kind,))
        parts[kind] = None if part is None else str(part.get_content())
    return cached_json(
        request,
        {
            "name": name,
            "user_id": user_id,
            "subject": str(message["Subject"]),
            "text": parts["plain"],
            "html": parts["html"],
        },
    )


@router.put("/templates/{name}", summary="create or update an SES template")
def put_template(
    request: Request, principal: Admin, name: TemplateName, body: TemplatePut
) -> JSONResponse:
    def operation() -> tuple[int, Any]:
        _ses(request).put_template(name, body.subject, body.html, body.text)
        # SES is not in our transaction: the row follows the change it records.
        with _state(request).pool.connection() as conn:
            record(conn, principal.actor, "template put", None, detail={"name": name})
        return 200, {"name": name}

    return idempotent(request, principal, body.model_dump(), operation)


@router.get("/campaigns/{campaign_id}/promo-codes", summary="codes issued and left")
def promo_counts(request: Request, principal: Viewer, campaign_id: CampaignId) -> Response:
    with _state(request).pool.connection() as conn:
        counts = PromoStore(conn).counts(campaign_id)
    if counts is None:
        raise ApiProblem(404, f"campaign {campaign_id} has no promo pool")
    return cached_json(request, counts.as_dict())


def _pool_change(
    request: Request, principal: Admin, campaign_id: int, body: Any, add: Any
) -> JSONResponse:
    def operation() -> tuple[int, Any]:
        with psycopg.connect(_state(request).settings.pg_dsn, autocommit=True) as conn:
            store = PromoStore(conn)
            added = add(store)
            counts = store.counts(campaign_id)
        left = counts.left if counts else added
        return 200, {"campaign_id": campaign_id, "added": added, "promo_codes_left": left}

    return idempotent(request, principal, body.model_dump(), operation)


@router.post("/campaigns/{campaign_id}/promo-codes/generate", summary="`promo generate`")
def promo_generate(
    request: Request, principal: Admin, campaign_id: CampaignId, body: PromoGenerate
) -> JSONResponse:
    try:
        pattern = parse_pattern(body.pattern)
        check_count(pattern, body.count)
    except PatternError as exc:
        raise field_error("body.pattern", str(exc)) from None
    return _pool_change(
        request,
        principal,
        campaign_id,
        body,
        lambda store: len(store.generate(campaign_id, pattern, body.count, principal.actor)),
    )


@router.post("/campaigns/{campaign_id}/promo-codes/import", summary="`promo import`")
def promo_import(
    request: Request, principal: Admin, campaign_id: CampaignId, body: PromoImport
) -> JSONResponse:
    try:
        codes = read_pool_file(body.codes)
    except PoolFileError as exc:
        raise field_error("body.codes", str(exc)) from None
    return _pool_change(
        request,
        principal,
        campaign_id,
        body,
        lambda store: store.import_codes(campaign_id, codes, principal.actor),
    )


@router.get("/dead-letters", summary="dead letters, with why and where from (`dlq list`)")
def dead_letters(
    request: Request, principal: Admin, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> Response:
    from producers.dlq import read_dead_letters

    settings = _state(request).settings
    letters = read_dead_letters(settings.kafka_bootstrap, settings.topic_dlq, limit=limit)
    return cached_json(request, {"items": letters})


@router.get("/dead-letters/{ref}", summary="one dead letter, decoded (`dlq show`)")
def dead_letter(
    request: Request, principal: Admin, ref: Annotated[str, Path(pattern=r"^(\d+:)?\d+$")]
) -> Response:
    from flashsend.cli.operations import decode_letter
    from producers.dlq_replay import parse_ref, read_letters, replayed

    settings = _state(request).settings
    key = parse_ref(ref)
    letter = next(
        (x for x in read_letters(settings) if (x.dlq_partition, x.dlq_offset) == key), None
    )
    if letter is None:
        raise ApiProblem(404, f"no dead letter {ref} in {settings.topic_dlq}")
    out = {
        **letter.as_dict(),
        "decoded": decode_letter(settings, letter),
        "times_replayed": replayed(settings).get(key, 0),
    }
    return cached_json(request, out)


@router.get("/suppressions", summary="suppressed addresses (address: one exact address)")
def suppressions(
    request: Request,
    principal: Admin,
    address: Annotated[str | None, Query(min_length=3, max_length=320)] = None,
    after: Annotated[str | None, Query(max_length=320, description="next page: next_after")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    with _state(request).pool.connection() as conn:
        rows = SuppressionStore(conn).find(address=address, after=after, limit=limit)
    next_after = rows[-1]["email"] if len(rows) == limit else None
    return cached_json(request, {"items": rows, "next_after": next_after})


@router.post("/suppressions", status_code=201, summary="suppress an address, with a reason")
def suppress(request: Request, principal: Admin, body: SuppressionChange) -> JSONResponse:
    def operation() -> tuple[int, Any]:
        with _state(request).pool.connection() as conn:
            row = SuppressionStore(conn).add(body.address, body.reason, principal.actor)
        return 201, row

    return idempotent(request, principal, body.model_dump(), operation)


@router.post("/suppressions/remove", summary="remove an address from the list, with a reason")
def unsuppress(request: Request, principal: Admin, body: SuppressionChange) -> JSONResponse:
    def operation() -> tuple[int, Any]:
        with _state(request).pool.connection() as conn:
            row = SuppressionStore(conn).remove(body.address, body.reason, principal.actor)
        return 200, row

    return idempotent(request, principal, body.model_dump(), operation)
