"""The stand-in's own JSON API under `/_admin/` (not part of SES): stats, faults, reset.

| route                                        | answer                                       |
|----------------------------------------------|----------------------------------------------|
| GET  /_admin/health                          | {"ok": true}                                 |
| GET  /_admin/stats[?campaign=C]              | accepted, duplicates, max_1s_window,         |
|                                              | promo_code_conflicts, …, now                 |
| GET  /_admin/rate[?campaign=C&bucket_ms=N]   | [[bucket start, recipients], …]              |
| GET  /_admin/messages[?campaign=C|destination=A][&limit=N] | last N journal records         |
| GET  /_admin/faults, POST /_admin/faults     | current settings (POST: partial update)      |
| POST /_admin/reset[?templates=1]             | forget accepted mail (and templates)         |
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from infra.ses_standin.account import SesAccount

DEFAULT_MESSAGES_LIMIT = 100


class AdminApi:
    """Route handlers bound to one account."""

    def __init__(self, account: SesAccount) -> None:
        self.account = account

    def register(self, app: web.Application) -> None:
        router = app.router
        router.add_get("/_admin/health", self.health)
        router.add_get("/_admin/stats", self.stats)
        router.add_get("/_admin/rate", self.rate)
        router.add_get("/_admin/messages", self.messages)
        router.add_get("/_admin/faults", self.get_faults)
        router.add_post("/_admin/faults", self.set_faults)
        router.add_post("/_admin/reset", self.reset)

    async def health(self, request: web.Request) -> web.Response:
        return _ok({"ok": True})

    async def stats(self, request: web.Request) -> web.Response:
        stats = dict(self.account.index.stats(request.query.get("campaign")))
        # Process-wide (not per campaign): calls accepted and never answered.
        stats["hung_calls"] = self.account.hung_calls
        stats["hung_recipients"] = self.account.hung_recipients
        # The stand-in's clock when it answered: acceptance times (first_ts, last_ts) are on
        # this clock, so a client compares its own against it before subtracting the two.
        stats["now"] = time.time()
        return _ok(stats)

    async def rate(self, request: web.Request) -> web.Response:
        try:
            bucket_ms = _int(request.query, "bucket_ms", 1000)
            rows = self.account.index.rate(request.query.get("campaign"), bucket_ms / 1000.0)
        except ValueError as exc:
            return _bad(str(exc))
        return _ok([[t, count] for t, count in rows])

    async def messages(self, request: web.Request) -> web.Response:
        try:
            limit = _int(request.query, "limit", DEFAULT_MESSAGES_LIMIT)
        except ValueError as exc:
            return _bad(str(exc))
        records = self.account.messages(
            campaign=request.query.get("campaign"),
            destination=request.query.get("destination"),
            limit=limit,
        )
        return _ok(records)

    async def get_faults(self, request: web.Request) -> web.Response:
        return _ok(self.account.config.to_dict())

    async def set_faults(self, request: web.Request) -> web.Response:
        try:
            changes = json.loads(await request.read() or b"{}")
            if not isinstance(changes, dict):
                raise ValueError("body must be a JSON object")
            config = self.account.configure(changes, time.time())
        except ValueError as exc:
            return _bad(str(exc))
        return _ok(config.to_dict())

    async def reset(self, request: web.Request) -> web.Response:
        templates = request.query.get("templates", "0").lower() in ("1", "true", "yes")
        self.account.reset(time.time(), templates=templates)
        return _ok({"ok": True})


def _int(query: Mapping[str, str], key: str, default: int) -> int:
    raw = query.get(key)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{key} must be an integer") from None
    if value <= 0:
        raise ValueError(f"{key} must be positive")
    return value


def _ok(body: Any) -> web.Response:
    return web.json_response(body)


def _bad(message: str) -> web.Response:
    return web.json_response({"error": message}, status=400)
