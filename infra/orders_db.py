"""The order service's database (the transactional-mail example's own PostgreSQL database):
created if missing and migrated from `infra/migrations_orders`."""

from __future__ import annotations

from pathlib import Path

import psycopg
from psycopg import sql

from flashsend.settings import Settings
from infra.migrate import apply_migrations

ORDERS_MIGRATIONS = Path(__file__).resolve().parent / "migrations_orders"


def ensure_orders_db(settings: Settings, *, monolith: bool = False) -> str:
    """Create the order database if missing and migrate it; returns its DSN. `monolith` also
    migrates the order tables into the mail database (the same-database mode)."""
    dsn = settings.orders_pg_dsn
    name = psycopg.conninfo.conninfo_to_dict(dsn).get("dbname")
    try:
        psycopg.connect(dsn).close()
    except psycopg.OperationalError:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(str(name))))
    apply_migrations(dsn, ORDERS_MIGRATIONS)
    if monolith:
        apply_migrations(settings.pg_dsn, ORDERS_MIGRATIONS)
    return dsn
