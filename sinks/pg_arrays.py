"""Array parameters written as PostgreSQL array literals, for the sender's hot statements.

psycopg dumps a Python list element by element in Python (types/array.py): for a claim of
2,000 keys that was ~2.4 ms of a worker's CPU, ~0.6 ms as one literal built with str.join
(docs/decisions.md). The statement casts the parameter (`%(seqs)s::int[]`), so PostgreSQL
parses the literal exactly as it would an array value sent by psycopg.

Text elements are always double-quoted, with backslash and double quote escaped: inside quotes
PostgreSQL's array input takes every other character literally (braces, commas, whitespace,
the word NULL). None becomes an unquoted NULL.
"""

from __future__ import annotations

from collections.abc import Iterable


def int_array(values: Iterable[int]) -> str:
    return "{" + ",".join(map(str, map(int, values))) + "}"


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def text_array(values: Iterable[str | None]) -> str:
    return "{" + ",".join("NULL" if v is None else _quoted(v) for v in values) + "}"


def nullable_int_array(values: Iterable[int | None]) -> str:
    return "{" + ",".join("NULL" if v is None else str(int(v)) for v in values) + "}"


def nullable_float_array(values: Iterable[float | None]) -> str:
    return "{" + ",".join("NULL" if v is None else repr(float(v)) for v in values) + "}"
