"""Array literals built by sinks.pg_arrays read back as the very values, through PostgreSQL."""

from __future__ import annotations

import random

import psycopg

from flashsend.settings import Settings
from sinks.pg_arrays import int_array, text_array

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
