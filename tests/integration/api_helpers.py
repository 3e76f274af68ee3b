"""The API for integration tests: the real app served by uvicorn on a free loopback port in
a thread of the test process, with one key per role, called over HTTP with httpx."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
import uvicorn
from fastapi import FastAPI

from flashsend.api.app import create_app
from flashsend.api.key_admin import create_key
from flashsend.settings import Settings
from infra.process import free_port
from sinks.audit_store import Actor, read_audit

ROLES = ("viewer", "operator", "admin")


@dataclass
class Api:
    settings: Settings
    url: str
    app: FastAPI
    keys: dict[str, str] = field(default_factory=dict)

    def client(self, role: str | None = None, key: str | None = None) -> httpx.Client:
        token = key if key is not None else (self.keys[role] if role else None)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60.0)

    def new_key(self, name: str, role: str) -> str:
        key, _ = create_key(self.settings, name, role, None, Actor("test"))
        return key


@contextmanager
def serve(settings: Settings) -> Iterator[Api]:
    """The API on a free port until the block ends; keys `viewer`, `operator`, `admin`."""
    app = create_app(settings)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the API did not start"
        time.sleep(0.02)
    api = Api(settings, f"http://127.0.0.1:{port}", app)
    for role in ROLES:
        api.keys[role] = api.new_key(f"test-{role}", role)
    try:
        yield api
    finally:
        server.should_exit = True
        thread.join(timeout=20)


def audit_rows(settings: Settings, campaign_id: int | None = None) -> list[dict[str, Any]]:
    """Oldest first."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return list(reversed(read_audit(conn, campaign_id=campaign_id, limit=10_000)))


def campaign_status(settings: Settings, campaign_id: int) -> str:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT status FROM campaigns WHERE id = %s", (campaign_id,)).fetchone()
    assert row is not None
    return str(row[0])


def assert_problem(response: httpx.Response, status: int) -> dict[str, Any]:
    """An RFC 9457 answer with `status`; its body."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/problem+json"), response.headers
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["title"] and body["type"] == "about:blank", body
    assert "Traceback" not in response.text and 'File "' not in response.text
    return body
