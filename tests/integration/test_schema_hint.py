"""A database that has not taken this version's migrations: the command says in one line to
run `flashsend migrate` instead of a traceback, and `flashsend migrate` fixes it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

from flashsend.settings import settings_env
from infra.migrate import MIGRATIONS_DIR, apply_migrations, discover
from tests.conftest import LocalStack

# The last migration before SMS quiet hours: campaigns and campaign_recipients lack columns
# the current code writes.
OLD_UNTIL = 26


def _cli(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flashsend.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_an_old_schema_gets_one_line_saying_to_migrate(stack: LocalStack, tmp_path: Path) -> None:
    old = tmp_path / "migrations"
    old.mkdir()
    for m in discover():
        if m.version <= OLD_UNTIL:
            shutil.copy(m.path, old / m.path.name)
    database = f"old_{uuid.uuid4().hex[:10]}"
    stack.postgres.create_database(database)
    settings = stack.settings_for(pg_database=database, pg_dsn=stack.settings.pg_dsn_for(database))
    apply_migrations(settings.pg_dsn, old)
    env = {**os.environ, **settings_env(settings)}

    done = _cli(env, "campaign", "create", "--name", "old schema")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "flashsend migrate" in lines[0] and "older than this flashsend" in lines[0]

    assert _cli(env, "migrate").returncode == 0
    assert apply_migrations(settings.pg_dsn, MIGRATIONS_DIR) == []
    created = _cli(env, "campaign", "create", "--name", "new schema")
    assert created.returncode == 0, created.stderr
