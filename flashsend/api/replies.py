"""Answers: JSON with an ETag on GETs (If-None-Match → 304), and POSTs made idempotent by
an `Idempotency-Key` header.

Idempotency: the first request with a key (per API key) claims it in PostgreSQL, runs, and
stores its answer; a retry with the same key and the same request gets that answer again
(`Idempotent-Replayed: true`) and nothing runs twice; one still running is waited for. The
same key with another request (method, path or body) is 422. A request that failed on our
side (5xx) gives its key back, so a retry runs.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from flashsend.api import problems
from flashsend.api.auth import Principal
from flashsend.api.state import ApiState
from sinks.api_key_store import ApiKeyStore

IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_KEY_LEN = 200
WAIT_FOR_FIRST_S = 120.0
# An unanswered claim this old belongs to a request whose process died (no operation takes
# this long: a 1M-recipient start is well under it).
STALE_CLAIM_S = 600.0


def etag_of(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:32] + '"'


def cached_json(request: Request, data: Any) -> Response:
    """`data` as JSON with its ETag; 304 without a body when the client has it already."""
    body = json.dumps(data, default=str, separators=(",", ":")).encode()
    tag = etag_of(body)
    given = request.headers.get("if-none-match", "")
    if tag in {t.strip() for t in given.split(",")} or given.strip() == "*":
        return Response(status_code=304, headers={"ETag": tag})
    return Response(body, media_type="application/json", headers={"ETag": tag})


def request_hash(method: str, path: str, body: Any) -> bytes:
    """What makes two requests the same one: method, path and the parsed body."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{method} {path}\n{canonical}".encode()).digest()


def _run(request: Request, operation: Callable[[], tuple[int, Any]]) -> tuple[int, Any, bool]:
    """(status, body, keep): the operation's answer, or its problem; keep is False for 5xx."""
    try:
        status, body = operation()
        return status, body, True
    except Exception as exc:
        problem = problems.from_exception(exc, request)
        return problem.status, problem.body, problem.status < 500


def _respond(status: int, body: Any, replayed: bool = False) -> JSONResponse:
    headers = {"Idempotent-Replayed": "true"} if replayed else {}
    media = problems.PROBLEM_JSON if status >= 400 else "application/json"
    return JSONResponse(body, status_code=status, headers=headers, media_type=media)


def idempotent(
    request: Request,
    principal: Principal,
    body: Any,
    operation: Callable[[], tuple[int, Any]],
) -> JSONResponse:
    """Run `operation` (→ status, JSON body) once per Idempotency-Key of this API key."""
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        status, out, _ = _run(request, operation)
        return _respond(status, out)
    if not key or len(key) > MAX_KEY_LEN:
        raise problems.field_error(f"header.{IDEMPOTENCY_HEADER}", f"1 to {MAX_KEY_LEN} characters")
    state: ApiState = request.app.state.api
    digest = request_hash(request.method, request.url.path, body)
    with state.pool.connection() as conn:
        claimed = ApiKeyStore(conn).claim(principal.key_id, key, digest)
    if not claimed.owner:
        if claimed.request_hash != digest:
            raise problems.field_error(
                f"header.{IDEMPOTENCY_HEADER}",
                "this key was used for another request (method, path or body); "
                "use a new key for a new request",
            )
        answered = _replay(state, principal, key, digest, claimed.status, claimed.body)
        if answered is not None:
            return answered
    status, out, keep = _run(request, operation)
    with state.pool.connection() as conn:
        store = ApiKeyStore(conn)
        if keep:
            store.answer(principal.key_id, key, status, out)
        else:
            store.give_back(principal.key_id, key)
    return _respond(status, out)


def _replay(
    state: ApiState, principal: Principal, key: str, digest: bytes, status: int | None, body: Any
) -> JSONResponse | None:
    """The first request's answer, once there is one; None when this request is to run the
    operation itself (the first one's claim was abandoned: given back, or stale)."""
    deadline = time.monotonic() + WAIT_FOR_FIRST_S
    while status is None:
        with state.pool.connection() as conn:
            store = ApiKeyStore(conn)
            if store.take_over(principal.key_id, key, digest, STALE_CLAIM_S):
                return None
            claimed = store.claim(principal.key_id, key, digest)
        if claimed.owner:  # the first request failed on our side and gave the key back
            return None
        status, body = claimed.status, claimed.body
        if status is not None:
            break
        if time.monotonic() > deadline:
            raise problems.ApiProblem(
                409, f"the first request with {IDEMPOTENCY_HEADER} {key!r} is still running"
            )
        time.sleep(0.05)
    return _respond(status, body, replayed=True)
