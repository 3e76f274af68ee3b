"""`/api/v1/audiences` (admin) and `/api/v1/audit` (viewer)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, Response

from flashsend.api.auth import Admin, Viewer
from flashsend.api.models import AudienceAdd
from flashsend.api.replies import cached_json, idempotent
from flashsend.api.state import ApiState
from sinks.api_key_store import ApiKeyStore
from sinks.audit_store import read_audit

router = APIRouter(prefix="/api/v1", tags=["admin"])


def _state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


@router.get("/audiences", summary="named audiences (their SQL)")
def list_audiences(request: Request, principal: Admin) -> Response:
    with _state(request).pool.connection() as conn:
        return cached_json(request, {"items": ApiKeyStore(conn).audiences()})


@router.post("/audiences", status_code=201, summary="register a named audience")
def add_audience(request: Request, principal: Admin, body: AudienceAdd) -> JSONResponse:
    def operation() -> tuple[int, Any]:
        with _state(request).pool.connection() as conn:
            ApiKeyStore(conn).add_audience(body.name, body.where, principal.actor)
        return 201, {"name": body.name, "where": body.where}

    return idempotent(request, principal, body.model_dump(), operation)


@router.get("/audit", summary="the audit log, newest first")
def audit(
    request: Request,
    principal: Viewer,
    campaign: Annotated[int | None, Query(ge=1)] = None,
    before_id: Annotated[int | None, Query(ge=1, description="next page: next_before_id")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    with _state(request).pool.connection() as conn:
        rows = read_audit(conn, campaign_id=campaign, before_id=before_id, limit=limit)
    next_id = rows[-1]["id"] if len(rows) == limit else None
    if principal.role != "admin":
        rows = [redacted(r) for r in rows]
    return cached_json(request, {"items": rows, "next_before_id": next_id})


def redacted(row: dict[str, Any]) -> dict[str, Any]:
    """A suppression change names an address: only an admin reads it in the audit log."""
    detail = row.get("detail")
    if isinstance(detail, dict) and "address" in detail:
        return {**row, "detail": {**detail, "address": "(admin only)"}}
    return row
