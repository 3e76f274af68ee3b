"""Who is asking: `Authorization: Bearer <key>` → the key's name and role, checked on every
request against PostgreSQL (a revoke or an expiry counts from the next request), then the
key's request budget, then the role the route needs.

A missing, malformed, unknown, wrong, revoked or expired key all get the same 401: the answer
does not tell an attacker which prefixes exist.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from flashsend.api.keys import allows, hash_matches, key_prefix
from flashsend.api.problems import ApiProblem
from flashsend.api.state import ApiState
from sinks.api_key_store import ApiKeyStore
from sinks.audit_store import Actor

bearer = HTTPBearer(auto_error=False, description="an API key: flashsend api-key create")
UNAUTHORIZED = "a valid API key is needed: Authorization: Bearer <key>"


@dataclass(frozen=True)
class Principal:
    key_id: int
    name: str
    role: str
    actor: Actor


def _authenticate(request: Request, credentials: HTTPAuthorizationCredentials | None) -> Principal:
    state: ApiState = request.app.state.api
    key = credentials.credentials if credentials is not None else ""
    prefix = key_prefix(key) if key else None
    stored = None
    if prefix is not None:
        with state.pool.connection() as conn:
            stored = ApiKeyStore(conn).by_prefix(prefix)
    ok = hash_matches(key, stored.key_hash if stored is not None else None)
    if not ok or stored is None or not stored.usable:
        raise ApiProblem(401, UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
    wait = state.budgets.take(stored.id, time.monotonic())
    if wait > 0:
        raise ApiProblem(
            429,
            f"over this key's budget of {state.settings.api_requests_per_minute:g} "
            "requests a minute",
            headers={"Retry-After": str(max(1, math.ceil(wait)))},
        )
    source = request.client.host if request.client is not None else None
    actor = Actor(stored.name, getattr(request.state, "request_id", None), source)
    return Principal(stored.id, stored.name, stored.role, actor)


def require(role: str) -> Callable[..., Principal]:
    """A dependency: the caller's key, which must hold `role` or more (403 otherwise)."""

    def dependency(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
    ) -> Principal:
        principal = _authenticate(request, credentials)
        if not allows(principal.role, role):
            raise ApiProblem(
                403, f"this needs the {role} role; key {principal.name!r} is {principal.role}"
            )
        return principal

    return dependency


Viewer = Annotated[Principal, Depends(require("viewer"))]
Operator = Annotated[Principal, Depends(require("operator"))]
Admin = Annotated[Principal, Depends(require("admin"))]
