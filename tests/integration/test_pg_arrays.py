"""Array literals built by sinks.pg_arrays read back as the very values, through PostgreSQL."""

from __future__ import annotations

import random

import psycopg

from flashsend.settings import Settings
from sinks.pg_arrays import int_array, nullable_float_array, nullable_int_array, text_array

NASTY = [
    "",
    "NULL",
    "null",
    " padded ",
    "a,b",
    "{braces}",
    '"quoted"',
    "back\\slash",
    "\\",
    '\\"',
    "tab\there",
    "line\nbreak",
    "ünï €",
    "throttled: Maximum sending rate exceeded.",
    None,
]


def test_text_and_int_arrays_round_trip(settings: Settings) -> None:
    rng = random.Random(7)
    alphabet = "\\\",{} \tNUL'x\n"
    fuzzed: list[str | None] = [
        "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12))) for _ in range(500)
    ]
    texts = NASTY + fuzzed
    ints = [0, -1, 2**31 - 1, -(2**31), 42, *range(1000)]
    with psycopg.connect(settings.pg_dsn) as conn:
        got_texts, got_ints, got_bigints = conn.execute(
            "SELECT %s::text[], %s::int[], %s::bigint[]",
            (text_array(texts), int_array(ints), int_array([2**62, -(2**62)])),
        ).fetchone() or (None, None, None)
        empty = conn.execute("SELECT %s::text[], %s::int[]", (text_array([]), int_array([])))
        assert empty.fetchone() == ([], [])
    assert got_texts == texts
    assert got_ints == ints
    assert got_bigints == [2**62, -(2**62)]


def test_nullable_number_arrays_round_trip(settings: Settings) -> None:
    ints = [None, 0, -1, 2**31 - 1, None, 7]
    floats = [None, 0.0, 1765.123456789, -2.5, 1e-7, 1.7e9 + 0.001, None]
    with psycopg.connect(settings.pg_dsn) as conn:
        got_ints, got_bigints, got_floats = conn.execute(
            "SELECT %s::int[], %s::bigint[], %s::float8[]",
            (
                nullable_int_array(ints),
                nullable_int_array([None, 2**62]),
                nullable_float_array(floats),
            ),
        ).fetchone() or (None, None, None)
    assert got_ints == ints
    assert got_bigints == [None, 2**62]
    assert got_floats == floats
