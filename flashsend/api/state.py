"""What one API process holds: its settings, a PostgreSQL pool, the keys' budgets and the
event broadcaster."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg_pool import ConnectionPool

from flashsend.api.keys import Budgets
from flashsend.settings import Settings


@dataclass
class ApiState:
    settings: Settings
    pool: ConnectionPool
    budgets: Budgets


def make_state(settings: Settings) -> ApiState:
    pool = ConnectionPool(
        settings.pg_dsn,
        min_size=1,
        max_size=max(2, settings.api_pool_size),
        kwargs={"autocommit": True},
        open=False,
        name="flashsend-api",
    )
    burst = settings.api_requests_burst or None
    return ApiState(settings, pool, Budgets(settings.api_requests_per_minute, burst))
