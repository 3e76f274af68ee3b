"""Console sessions: sign in with an API key → a random token in a cookie (HttpOnly,
SameSite=Strict, Secure over https, an absolute expiry); the table keeps its sha256, the
session's CSRF token and the key it acts for. Every request reads the session with its key,
so a sign-out, the session's expiry or the key's revoke counts from the next request.

State changes need the session's CSRF token in the form (`csrf`) or the `X-CSRF-Token`
header; the sign-in form, before any session exists, carries a token that must equal its
cookie's (double submit).
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass
from urllib.parse import parse_qs

from fastapi import Request
from fastapi.responses import Response

from flashsend.api.auth import Principal
from flashsend.api.keys import hash_matches, key_prefix
from flashsend.api.state import ApiState
from sinks.api_key_store import ApiKeyStore
from sinks.audit_store import Actor
from sinks.console_session_store import ConsoleSessionStore

SESSION_COOKIE = "flashsend_session"
SIGN_IN_COOKIE = "flashsend_sign_in"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"


@dataclass(frozen=True)
class ConsoleUser:
    principal: Principal
    csrf_token: str


class BudgetSpent(Exception):
    """Over this key's request budget."""


def _state(request: Request) -> ApiState:
    state: ApiState = request.app.state.api
    return state


def _actor(request: Request, name: str) -> Actor:
    source = request.client.host if request.client is not None else None
    return Actor(name, getattr(request.state, "request_id", None), source)


def current(request: Request) -> ConsoleUser | None:
    """The signed-in user of this request, or None (no cookie, ended, expired, key revoked)."""
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        return None
    state = _state(request)
    with state.pool.connection() as conn:
        session = ConsoleSessionStore(conn).usable(token)
    if session is None:
        return None
    if state.budgets.take(session.api_key_id, time.monotonic()) > 0:
        raise BudgetSpent()
    principal = Principal(
        session.api_key_id, session.name, session.role, _actor(request, session.name)
    )
    return ConsoleUser(principal, session.csrf_token)


def sign_in(request: Request, key: str) -> str | None:
    """A new session's token for a usable API key, else None (the same for every refusal)."""
    state = _state(request)
    prefix = key_prefix(key)
    stored = None
    with state.pool.connection() as conn:
        if prefix is not None:
            stored = ApiKeyStore(conn).by_prefix(prefix)
        ok = hash_matches(key, stored.key_hash if stored is not None else None)
        if not ok or stored is None or not stored.usable:
            return None
        token = secrets.token_urlsafe(32)
        ttl_s = state.settings.console_session_hours * 3600.0
        ConsoleSessionStore(conn).create(token, secrets.token_urlsafe(32), stored.id, ttl_s)
    return token


def sign_out(request: Request) -> None:
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        with _state(request).pool.connection() as conn:
            ConsoleSessionStore(conn).end(token)


def set_session_cookie(request: Request, response: Response, token: str) -> None:
    response.set_cookie(
        SESSION_COOKIE,
        token,
        max_age=int(_state(request).settings.console_session_hours * 3600),
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def sign_in_token(request: Request) -> str:
    """The sign-in form's token: its cookie's, or a new one."""
    return request.cookies.get(SIGN_IN_COOKIE) or secrets.token_urlsafe(24)


def set_sign_in_cookie(request: Request, response: Response, token: str) -> None:
    response.set_cookie(
        SIGN_IN_COOKIE,
        token,
        max_age=3600,
        path="/console/sign-in",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def same(given: str | None, expected: str | None) -> bool:
    """Constant-time equality of two tokens; a missing one never matches."""
    if not given or not expected:
        return False
    return hmac.compare_digest(given.encode(), expected.encode())


def csrf_ok(request: Request, user: ConsoleUser, form: dict[str, str]) -> bool:
    given = form.get(CSRF_FIELD) or request.headers.get(CSRF_HEADER)
    return same(given, user.csrf_token)


async def read_form(request: Request) -> dict[str, str]:
    """An application/x-www-form-urlencoded body (the console's forms); the first value of
    each field."""
    if not request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        return {}
    body = (await request.body()).decode("utf-8", errors="replace")
    return {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}
