"""Numbered SQL migrations (`infra/migrations/NNNN_name.sql`), applied once each, in order.

Each file runs in its own transaction together with its row in `schema_migrations`, so a
failed migration leaves nothing behind and re-running `flashsend migrate` is a no-op.
An advisory lock serialises concurrent runs (two workers starting at once).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import psycopg

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_LOCK_KEY = 0x666C617368  # "flash"
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if match is None:
            raise ValueError(f"migration file name must look like 0001_name.sql: {path.name}")
        found.append(Migration(int(match.group(1)), match.group(2), path))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ValueError(f"duplicate migration numbers in {directory}")
    return found


def apply_migrations(dsn: str, directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Apply pending migrations; return the ones applied now."""
    applied_now: list[Migration] = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version int PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
        try:
            done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
            for migration in discover(directory):
                if migration.version in done:
                    continue
                with conn.transaction():
                    conn.execute(migration.path.read_text())
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                        (migration.version, migration.name),
                    )
                applied_now.append(migration)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
    return applied_now
