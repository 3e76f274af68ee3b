"""Helpers for campaign integration tests: seed, create, start, run workers, wait."""

from __future__ import annotations

import time
from typing import Any

import psycopg

from flashsend.commands.campaign import (
    DEFAULT_HTML,
    DEFAULT_SUBJECT,
    DEFAULT_TEMPLATE,
    DEFAULT_TEXT,
    create_campaign,
)
from flashsend.settings import Settings
from flashsend.workers import WorkerPool
from infra.ses_standin.admin import SesStandinAdmin
from sinks.campaign_store import CampaignStore, Progress
from sinks.ses import SesSender, make_client


def admin(settings: Settings) -> SesStandinAdmin:
    assert settings.ses_endpoint_url
    return SesStandinAdmin(settings.ses_endpoint_url)


def put_template(settings: Settings) -> None:
    SesSender(make_client(settings, timeout=10)).put_template(
        DEFAULT_TEMPLATE, DEFAULT_SUBJECT, DEFAULT_HTML, DEFAULT_TEXT)


def new_campaign(settings: Settings, *, rate: float = 0.0, name: str = "t") -> int:
    put_template(settings)
    return create_campaign(settings, name=name, rate=rate)


def progress(settings: Settings, campaign_id: int) -> Progress:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return CampaignStore(conn).progress(campaign_id)


def wait_finished(settings: Settings, campaign_id: int, pool: WorkerPool | None = None,
                  timeout: float = 120.0) -> Progress:
    deadline = time.monotonic() + timeout
    while True:
        p = progress(settings, campaign_id)
        if p.finished:
            return p
        if pool is not None and not pool.alive():
            raise AssertionError(f"workers died; logs in {pool.log_dir}")
        if time.monotonic() > deadline:
            raise AssertionError(f"campaign {campaign_id} not finished: {p.as_dict()}")
        time.sleep(0.3)


def statuses(settings: Settings, campaign_id: int) -> dict[str, int]:
    with psycopg.connect(settings.pg_dsn) as conn:
        rows = conn.execute("SELECT status, count(*) FROM campaign_recipients "
                            "WHERE campaign_id = %s GROUP BY status", (campaign_id,)).fetchall()
    return {str(s): int(n) for s, n in rows}


def stats(settings: Settings, campaign_id: int) -> dict[str, Any]:
    return dict(admin(settings).stats(campaign=str(campaign_id)))
