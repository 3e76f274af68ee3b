"""The console's state changes (POST): sign in and out, campaign control, suppressions.

Each checks the session, then its CSRF token, then the role, and calls the API's own route
function (flashsend/api/campaigns.py, extras.py): the same operation, the same audit row,
no second path to a transition. Refusals are 403 pages; a done change answers 303 back to
the page it came from.
"""

from __future__ import annotations

import json
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Path, Request
from fastapi.responses import RedirectResponse, Response
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from flashsend.api import campaigns, extras
from flashsend.api.console.pages import SECURITY_HEADERS, over_budget, render, to_sign_in
from flashsend.api.console.session import (
    SIGN_IN_COOKIE,
    BudgetSpent,
    ConsoleUser,
    csrf_ok,
    current,
    read_form,
    same,
    set_session_cookie,
    sign_in,
    sign_out,
)
from flashsend.api.keys import allows
from flashsend.api.models import (
    CampaignControl,
    CampaignCreate,
    CampaignPromote,
    CampaignRelease,
    CampaignStart,
    SuppressionChange,
)
from flashsend.api.problems import ApiProblem

router = APIRouter(include_in_schema=False)
CampaignId = Annotated[int, Path(ge=1)]
# What each campaign button needs.
NEEDS = {
    "start": "operator",
    "pause": "operator",
    "resume": "operator",
    "cancel": "operator",
    "promote": "operator",
    "release": "operator",
}


def _refuse(request: Request, user: ConsoleUser | None, text: str) -> Response:
    return render(request, "message.html", user, 403, title="Refused", text=text)


async def _checked(request: Request, needs: str) -> tuple[ConsoleUser, dict[str, str]] | Response:
    """(user, form) when signed in, with the session's CSRF token and the role; else 403."""
    form = await read_form(request)
    try:
        user = await run_in_threadpool(current, request)
    except BudgetSpent:
        return over_budget(request, "retry")
    if user is None:
        return _refuse(request, None, "Not signed in (or the session ended): sign in again.")
    if not csrf_ok(request, user, form):
        return _refuse(
            request,
            user,
            "The form's CSRF token is missing or wrong: reload the page and try again.",
        )
    if not allows(user.principal.role, needs):
        return _refuse(
            request, user, f"This needs the {needs} role; you are {user.principal.role}."
        )
    return user, form


def _outcome(answer: Response) -> str:
    """The API's answer in one line: its message, or the problem's title and detail."""
    body: dict[str, Any] = json.loads(bytes(answer.body))
    if answer.status_code < 400:
        return str(body.get("message") or f"done: {body.get('status', '')}".strip())
    return f"refused ({answer.status_code}): {body.get('detail') or body.get('title')}"


def _back(path: str, note: str) -> RedirectResponse:
    return RedirectResponse(f"{path}?note={quote(note)}", status_code=303, headers=SECURITY_HEADERS)


@router.post("/console/sign-in")
async def sign_in_post(request: Request) -> Response:
    form = await read_form(request)
    if not same(form.get("sign_in_token"), request.cookies.get(SIGN_IN_COOKIE)):
        return _refuse(request, None, "The sign-in form is stale: reload it and try again.")
    token = await run_in_threadpool(sign_in, request, form.get("key", "").strip())
    if token is None:
        return RedirectResponse("/console/sign-in?failed=true", status_code=303)
    response = RedirectResponse("/console/", status_code=303, headers=SECURITY_HEADERS)
    set_session_cookie(request, response, token)
    response.delete_cookie(SIGN_IN_COOKIE, path="/console/sign-in")
    return response


@router.post("/console/sign-out")
async def sign_out_post(request: Request) -> Response:
    checked = await _checked(request, "viewer")
    if isinstance(checked, Response):
        return checked
    await run_in_threadpool(sign_out, request)
    response = to_sign_in()
    response.delete_cookie("flashsend_session", path="/")
    return response


def _call(request: Request, user: ConsoleUser, cid: int, action: str, form: dict[str, str]) -> str:
    """Run one campaign button through the API's route function; its outcome in a line."""
    p = user.principal
    reason = form.get("reason") or f"{action} in the console by {p.name}"
    try:
        if action == "start":
            answer: Response = campaigns.start(request, p, cid, CampaignStart())
        elif action in ("pause", "resume", "cancel"):
            answer = campaigns._control(request, p, cid, action, CampaignControl(reason=reason))
        elif action == "promote":
            body = CampaignPromote(variant=form.get("variant", ""))
            answer = campaigns.promote_variant(request, p, cid, body)
        else:
            answer = campaigns.release_hold(request, p, cid, CampaignRelease())
    except (ApiProblem, ValidationError) as exc:
        return f"refused: {exc}"
    return _outcome(answer)


@router.post("/console/campaigns/{campaign_id}/{action}")
async def campaign_action(request: Request, campaign_id: CampaignId, action: str) -> Response:
    needs = NEEDS.get(action)
    if needs is None:
        return render(
            request,
            "message.html",
            None,
            404,
            title="Not found",
            text=f"There is no action {action!r}.",
        )
    checked = await _checked(request, needs)
    if isinstance(checked, Response):
        return checked
    user, form = checked
    note = await run_in_threadpool(_call, request, user, campaign_id, action, form)
    return _back(f"/console/campaigns/{campaign_id}", note)


@router.post("/console/campaigns")
async def create_campaign(request: Request) -> Response:
    checked = await _checked(request, "admin")
    if isinstance(checked, Response):
        return checked
    user, form = checked
    try:
        rate = float(form.get("rate") or 0)
        body = CampaignCreate(
            name=form.get("name", ""), rate=rate, template=form.get("template") or None
        )
    except (ValueError, ValidationError) as exc:
        return _back("/console/", f"refused: {exc}")
    answer = await run_in_threadpool(campaigns.create, request, user.principal, body)
    if answer.status_code >= 400:
        return _back("/console/", _outcome(answer))
    created = json.loads(bytes(answer.body))["id"]
    return _back(f"/console/campaigns/{created}", f"created campaign {created}")


@router.post("/console/suppressions/{change}")
async def suppression_change(request: Request, change: str) -> Response:
    if change not in ("add", "remove"):
        return render(request, "message.html", None, 404, title="Not found", text=change)
    checked = await _checked(request, "admin")
    if isinstance(checked, Response):
        return checked
    user, form = checked
    try:
        body = SuppressionChange(address=form.get("address", ""), reason=form.get("reason", ""))
    except ValidationError as exc:
        return _back("/console/suppressions", f"refused: {exc.errors()[0]['msg']}")
    operation = extras.suppress if change == "add" else extras.unsuppress
    try:
        answer = await run_in_threadpool(operation, request, user.principal, body)
    except ApiProblem as exc:
        return _back("/console/suppressions", f"refused: {exc}")
    return _back("/console/suppressions", f"{change}: {body.address}: {_outcome(answer)}")
