"""The console's pages (GET): campaigns, one campaign, suppressions, templates, sign-in, and
its event stream under the session's cookie. Counts are rendered on the server, so reading
works without JavaScript; the script only keeps them current (docs/console.md)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any

import jinja2
import markupsafe
from fastapi import APIRouter, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from psycopg.rows import dict_row

from flashsend.api import extras
from flashsend.api.console import views
from flashsend.api.console.session import (
    BudgetSpent,
    ConsoleUser,
    current,
    set_sign_in_cookie,
    sign_in_token,
)
from flashsend.api.events import stream
from flashsend.api.keys import allows
from flashsend.api.problems import ApiProblem
from flashsend.api.state import ApiState
from flashsend.errors import NotFound
from sinks.audit_store import read_audit
from sinks.campaign_store import CampaignStore
from sinks.campaign_views import report_view, status_view
from sinks.console_session_store import ConsoleSessionStore
from sinks.queries import query
from sinks.suppression_store import SuppressionStore

HERE = Path(__file__).parent
router = APIRouter(include_in_schema=False)
CampaignId = Annotated[int, PathParam(ge=1)]
SECURITY_HEADERS = {
    # Every asset is ours: no CDN, no inline script, no framing.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE / "templates"),
    autoescape=True,
    undefined=jinja2.ChainableUndefined,  # absent sections (no A/B test, no ramp) are empty
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters["num"] = views.number
templates.filters["when"] = lambda value: markupsafe.Markup(views.when(value))
templates.filters["duration"] = views.duration


def _state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


def render(
    request: Request, page: str, user: ConsoleUser | None, code: int = 200, **context: Any
) -> HTMLResponse:
    context.setdefault("note", request.query_params.get("note"))
    html = templates.get_template(page).render(
        user=user,
        role=user.principal.role if user else None,
        csrf=user.csrf_token if user else "",
        allows=allows,
        **context,
    )
    return HTMLResponse(html, status_code=code, headers=SECURITY_HEADERS)


def to_sign_in() -> RedirectResponse:
    return RedirectResponse("/console/sign-in", status_code=303, headers=SECURITY_HEADERS)


def over_budget(request: Request, then: str) -> Response:
    """429 for a session whose key spent its request budget; `then`: what the user does."""
    return render(
        request,
        "message.html",
        None,
        429,
        title="Too many requests",
        text=f"Over this key's request budget: wait a moment and {then}.",
    )


def signed_in(request: Request) -> ConsoleUser | Response:
    """The user, or the answer to send instead: sign-in for none, 429 over the budget."""
    try:
        user = current(request)
    except BudgetSpent:
        return over_budget(request, "reload")
    return user if user is not None else to_sign_in()


@router.get("/")
def root() -> RedirectResponse:
    return RedirectResponse("/console/", status_code=303)


@router.get("/console/sign-in")
def sign_in_page(request: Request, failed: bool = False) -> Response:
    token = sign_in_token(request)
    response = render(
        request, "sign_in.html", None, 401 if failed else 200, failed=failed, token=token
    )
    set_sign_in_cookie(request, response, token)
    return response


def _campaign_rows(request: Request, status: str | None, channel: str | None) -> list[Any]:
    params = {"status": status, "channel": channel, "before_id": None, "limit": 100}
    rows = []
    with _state(request).pool.connection() as conn:
        cur = conn.cursor(row_factory=dict_row)
        for row in cur.execute(query("list_campaigns"), params).fetchall():
            view = CampaignStore(conn).progress(row["id"]).as_dict()  # the counters only
            rate = float(view.get("send_rate_per_s") or 0.0)
            total = int(view.get("recipients") or 0)
            done = views.done_count(view)
            rows.append(
                {
                    **row,
                    "view": view,
                    "done": done,
                    "percent": views.percent(done, total),
                    "rate": rate if row["status"] not in views.FINAL else 0.0,
                    "eta_s": views.eta_s(view, rate) if row["status"] == "sending" else None,
                }
            )
    return rows


@router.get("/console/")
def campaigns_page(
    request: Request,
    status: Annotated[str | None, Query(max_length=20)] = None,
    channel: Annotated[str | None, Query(max_length=10)] = None,
) -> Response:
    user = signed_in(request)
    if not isinstance(user, ConsoleUser):
        return user
    status = status or None
    channel = channel if channel in ("email", "sms") else None
    rows = _campaign_rows(request, status, channel)
    return render(
        request,
        "campaigns.html",
        user,
        rows=rows,
        status=status or "",
        channel=channel or "",
        statuses=("draft", "snapshotting", "sending", "paused", "done", "cancelled", "failed"),
    )


def _feedback(conn: Any, campaign_id: int) -> dict[str, Any] | None:
    cur = conn.cursor(row_factory=dict_row)
    row: dict[str, Any] | None = cur.execute(
        query("console_campaign_feedback"), {"id": campaign_id}
    ).fetchone()
    return row


@router.get("/console/campaigns/{campaign_id}")
def campaign_page(request: Request, campaign_id: CampaignId) -> Response:
    user = signed_in(request)
    if not isinstance(user, ConsoleUser):
        return user
    settings = _state(request).settings
    try:
        with _state(request).pool.connection() as conn:
            view = status_view(conn, campaign_id)
            elapsed = float(view.get("elapsed_s") or 0.0)
            report = report_view(conn, campaign_id, max(1.0, round(elapsed / 60.0)))
            feedback = _feedback(conn, campaign_id)
            audit = read_audit(conn, campaign_id=campaign_id, limit=50)
            template = conn.execute(
                "SELECT template FROM campaigns WHERE id = %s", (campaign_id,)
            ).fetchone()
    except NotFound:
        return render(
            request,
            "message.html",
            user,
            404,
            title="No such campaign",
            text=f"There is no campaign {campaign_id}.",
        )
    rate = float(view.get("send_rate_per_s") or 0.0) if view["status"] == "sending" else 0.0
    points, top = views.chart_points(report["rate_over_time"])
    return render(
        request,
        "campaign.html",
        user,
        c=view,
        template_name=template[0] if template else None,
        report=report,
        counts=views.COUNTS,
        done=views.done_count(view),
        percent=views.percent(views.done_count(view), int(view.get("recipients") or 0)),
        rate=rate,
        eta_s=views.eta_s(view, rate),
        thresholds=views.feedback_rates(
            feedback, settings.feedback_complaint_threshold, settings.feedback_bounce_threshold
        ),
        chart_points=points,
        chart_top=top,
        audit=audit,
        actions=views.actions(user.principal.role, view["status"]),
        final=view["status"] in views.FINAL,
    )


@router.get("/console/campaigns/{campaign_id}/events")
async def campaign_events(request: Request, campaign_id: CampaignId) -> Response:
    """The API's event stream under the session's cookie (an EventSource sends no header)."""
    user = await asyncio.to_thread(signed_in, request)
    if not isinstance(user, ConsoleUser):
        return Response(status_code=401)
    broadcaster = request.app.state.broadcaster
    try:
        first = await broadcaster.first_frame(campaign_id)
    except NotFound:
        return Response(status_code=404)
    token = request.cookies.get("flashsend_session", "")

    def session_usable() -> bool:
        with _state(request).pool.connection() as conn:
            return ConsoleSessionStore(conn).usable(token) is not None

    return StreamingResponse(
        stream(broadcaster, campaign_id, first, session_usable),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


@router.get("/console/suppressions")
def suppressions_page(
    request: Request, address: Annotated[str | None, Query(max_length=320)] = None
) -> Response:
    user = signed_in(request)
    if not isinstance(user, ConsoleUser):
        return user
    if not allows(user.principal.role, "admin"):
        return render(
            request,
            "message.html",
            user,
            403,
            title="Admins only",
            text="The suppression list needs the admin role.",
        )
    with _state(request).pool.connection() as conn:
        rows = SuppressionStore(conn).find(address=address or None, after=None, limit=100)
    return render(request, "suppressions.html", user, rows=rows, address=address or "")


@router.get("/console/templates")
def templates_page(
    request: Request,
    name: Annotated[str | None, Query(pattern=r"^[A-Za-z0-9_-]{0,64}$")] = None,
    user_id: Annotated[int | None, Query(ge=1)] = None,
) -> Response:
    user = signed_in(request)
    if not isinstance(user, ConsoleUser):
        return user
    names = extras._ses(request).list_templates(limit=1000)
    preview, error = None, None
    if name and allows(user.principal.role, "admin"):
        try:
            answer = extras.preview_template(request, user.principal, name, user_id or 1)
            preview = json.loads(bytes(answer.body))
        except ApiProblem as exc:
            error = str(exc)
    return render(
        request,
        "templates.html",
        user,
        names=names,
        name=name or "",
        user_id=user_id or 1,
        preview=preview,
        error=error,
    )
