"""One error shape for every 4xx and 5xx: RFC 9457 `application/problem+json`.

Bad input names its field (`errors[].field`) and changes nothing; a state conflict carries the
current state; a 500 says only that the request failed, with its id (the trace goes to the
log, never to the client).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from flashsend.errors import Conflict, FlashsendError, NotFound, UsageError

PROBLEM_JSON = "application/problem+json"
log = logging.getLogger("flashsend.api")


class ApiProblem(Exception):
    """An answer other than success, raised anywhere below a route."""

    def __init__(
        self,
        status: int,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers or {}
        self.extra = extra


def field_error(field: str, message: str) -> ApiProblem:
    """422 naming the request field at fault."""
    return ApiProblem(422, f"{field}: {message}", errors=[{"field": field, "message": message}])


@dataclass(frozen=True)
class Problem:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]

    def response(self) -> JSONResponse:
        return JSONResponse(
            self.body, status_code=self.status, headers=self.headers, media_type=PROBLEM_JSON
        )


def build(
    status: int,
    detail: str | None,
    request: Request | None,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> Problem:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
    }
    if detail:
        body["detail"] = detail
    if request is not None:
        body["instance"] = request.url.path
        request_id = getattr(request.state, "request_id", None)
        if request_id:
            body["request_id"] = request_id
    body.update(extra)
    return Problem(status, body, dict(headers or {}))


def from_exception(exc: BaseException, request: Request | None) -> Problem:
    """The problem an exception from an operation or a route answers with."""
    if isinstance(exc, ApiProblem):
        return build(exc.status, exc.detail, request, exc.headers, **exc.extra)
    if isinstance(exc, Conflict):
        return build(409, str(exc), request, state=exc.state)
    if isinstance(exc, NotFound):
        return build(404, str(exc), request)
    if isinstance(exc, UsageError):
        return build(422, str(exc), request)
    if isinstance(exc, FlashsendError):
        # A service the operation needs refused or failed (SES preflight, Kafka): nothing
        # was changed that a retry would not resume.
        return build(503, str(exc), request)
    if isinstance(exc, psycopg.errors.TransactionRollback):
        # A deadlock or serialization failure rolled back the statement's transaction; an
        # earlier step of the operation may have committed (the campaign's GET says).
        log.warning("request rolled back by PostgreSQL: %s", exc.sqlstate, exc_info=exc)
        return build(
            503,
            "PostgreSQL rolled back a step of this request (a concurrent change); "
            "read the campaign's state and send it again",
            request,
            {"Retry-After": "1"},
        )
    if isinstance(exc, psycopg.OperationalError):
        log.warning("PostgreSQL failed the request: %s", exc.sqlstate, exc_info=exc)
        return build(503, "PostgreSQL is unreachable or failed the request", request)
    log.error(
        "request failed: %s %s",
        getattr(request, "method", "?"),
        getattr(getattr(request, "url", None), "path", "?"),
        exc_info=exc,
    )
    return build(500, "the request failed on our side; its request_id is in our log", request)


def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = []
    for e in exc.errors():
        where = [str(p) for p in e.get("loc", ())]
        errors.append({"field": ".".join(where), "message": str(e.get("msg", "invalid"))})
    detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors) or "invalid request"
    return build(422, detail, request, errors=errors).response()


def install(app: FastAPI) -> None:
    """Every error path answers problem+json."""

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        return build(
            exc.status_code, str(exc.detail) if exc.detail else None, request, exc.headers
        ).response()

    async def validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        return _validation(request, exc)

    async def operation(request: Request, exc: Exception) -> JSONResponse:
        return from_exception(exc, request).response()

    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(ApiProblem, operation)
    app.add_exception_handler(FlashsendError, operation)
    app.add_exception_handler(psycopg.Error, operation)
