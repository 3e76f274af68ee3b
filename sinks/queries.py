"""Named SQL statements kept in `sinks/sql/*.sql`.

Each statement starts with a header line `-- name: some_name` followed by comment lines that
say why it is safe under concurrency, then the SQL. Parameters use psycopg's `%(name)s`.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

SQL_DIR = Path(__file__).parent / "sql"
_HEADER = re.compile(r"^-- name: ([a-z0-9_]+)\s*$", re.MULTILINE)


@cache
def _load() -> dict[str, str]:
    statements: dict[str, str] = {}
    for path in sorted(SQL_DIR.glob("*.sql")):
        text = path.read_text()
        parts = _HEADER.split(text)
        for name, body in zip(parts[1::2], parts[2::2], strict=True):
            if name in statements:
                raise ValueError(f"duplicate SQL statement name {name} in {path}")
            statements[name] = body.strip()
    return statements


def query(name: str) -> str:
    """The SQL text of a named statement (KeyError names the missing one)."""
    try:
        return _load()[name]
    except KeyError:
        raise KeyError(f"no SQL statement named {name!r} in {SQL_DIR}") from None
