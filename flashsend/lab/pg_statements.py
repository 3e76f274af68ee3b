"""Server time per statement over a run (pg_stat_statements, preloaded by the local stack's
PostgreSQL): the cost model's per-statement rows. Time, not CPU: PostgreSQL's executor and
planner time of each normalised statement, summed over every backend."""

from __future__ import annotations

import re
from typing import Any

import psycopg

_SPACE = re.compile(r"\s+")


def reset(dsn: str) -> bool:
    """Zero the counters; False when the extension is not available (a server without it
    preloaded), so the run simply reports none."""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT pg_stat_statements_reset()")
        return True
    except psycopg.Error:
        return False


def top(dsn: str, per: int, *, limit: int = 12) -> list[dict[str, Any]]:
    """The `limit` statements with the most server time since `reset`, each with its calls,
    rows, and µs per unit of `per` (recipients sent)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT query, calls, rows, total_exec_time + total_plan_time"
            "  FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " ORDER BY 4 DESC LIMIT %s",
            (limit,),
        ).fetchall()
    return [
        {
            "statement": _SPACE.sub(" ", str(query)).strip()[:90],
            "calls": int(calls),
            "rows": int(n),
            "ms": round(float(ms), 1),
            "us_per_recipient": round(float(ms) * 1000.0 / max(per, 1), 2),
        }
        for query, calls, n, ms in rows
    ]
