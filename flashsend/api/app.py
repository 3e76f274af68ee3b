"""The FastAPI application: probes, metrics, the routers, one error shape, request ids."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import FastAPI, Path, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)

from flashsend.api import admin, campaigns, extras, problems
from flashsend.api.auth import Viewer
from flashsend.api.console import actions as console_actions
from flashsend.api.console import pages as console_pages
from flashsend.api.events import Broadcaster, stream
from flashsend.api.state import ApiState, make_state
from flashsend.settings import Settings
from sinks.api_key_store import ApiKeyStore

VERSION = "1"


def _metrics(registry: CollectorRegistry) -> tuple[Counter, Histogram]:
    requests = Counter(
        "flashsend_api_requests",
        "API requests by route and status",
        ["method", "route", "status"],
        registry=registry,
    )
    seconds = Histogram(
        "flashsend_api_request_seconds",
        "API request duration (streams: until the stream opened)",
        ["method", "route"],
        registry=registry,
        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    )
    return requests, seconds


def create_app(settings: Settings) -> FastAPI:
    state = make_state(settings)
    broadcaster = Broadcaster(state.pool, settings.api_events_interval_s)
    registry = CollectorRegistry(auto_describe=True)
    requests, seconds = _metrics(registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.pool.open(wait=False)
        try:
            yield
        finally:
            state.pool.close()

    app = FastAPI(
        title="flashsend Campaign API",
        version=VERSION,
        description="Campaigns over HTTP: the same operations as the `flashsend` command "
        "line. Authorization: Bearer <API key> (flashsend api-key create). Errors are RFC "
        "9457 application/problem+json. POSTs take an Idempotency-Key header.",
        lifespan=lifespan,
    )
    app.state.api = state
    app.state.broadcaster = broadcaster
    problems.install(app)

    @app.middleware("http")
    async def request_context(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        request.state.request_id = uuid.uuid4().hex
        began = time.perf_counter()
        try:
            response = await call_next(request)
        except Exception as exc:  # never a stack trace to the client
            response = problems.from_exception(exc, request).response()
        route = request.scope.get("route")
        name = getattr(route, "path", "unmatched")
        requests.labels(request.method, name, str(response.status_code)).inc()
        seconds.labels(request.method, name).observe(time.perf_counter() - began)
        response.headers["X-Request-Id"] = request.state.request_id
        return response

    @app.get("/healthz", tags=["probes"], summary="the process answers")
    def healthz() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/readyz", tags=["probes"], summary="PostgreSQL answers")
    def readyz(request: Request) -> JSONResponse:
        api: ApiState = request.app.state.api
        try:
            with api.pool.connection(timeout=2.0) as conn:
                conn.execute("SELECT 1")
        except Exception:
            return problems.build(503, "PostgreSQL is unreachable", request).response()
        return JSONResponse({"ok": True})

    @app.get("/metrics", tags=["probes"], summary="Prometheus text: API requests")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(campaigns.router)
    app.include_router(admin.router)
    app.include_router(extras.router)
    app.include_router(console_pages.router)
    app.include_router(console_actions.router)
    app.mount("/console/static", StaticFiles(directory=console_pages.HERE / "static"), "static")

    @app.get(
        "/api/v1/campaigns/{campaign_id}/events",
        tags=["campaigns"],
        summary="live progress (text/event-stream): counts, rate, ETA, paused reason",
        response_class=StreamingResponse,
    )
    async def events(
        request: Request, principal: Viewer, campaign_id: Annotated[int, Path(ge=1)]
    ) -> StreamingResponse:
        first = await broadcaster.first_frame(campaign_id)  # 404 before the stream opens

        def key_usable() -> bool:
            with state.pool.connection() as conn:
                return ApiKeyStore(conn).usable(principal.key_id)

        return StreamingResponse(
            stream(broadcaster, campaign_id, first, key_usable),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    return app
