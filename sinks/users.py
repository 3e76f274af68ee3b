"""Synthetic users for demos and benchmarks, generated inside PostgreSQL (one statement per
table, so a million rows take seconds, not a Python loop).

Shares, roughly: 3 % inactive, 10 % opted out of marketing, 1.5 % of addresses suppressed
(past bounces/complaints), 0.2 % invalid addresses (empty, no @, double @, spaces).
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg


@dataclass(frozen=True)
class SeedResult:
    added: int
    total: int
    suppressed: int


SEED_USERS = """
INSERT INTO users (id, email, status, marketing_opt_in, first_name, opted_out_at)
SELECT g,
       CASE WHEN r_invalid < 0.002
            THEN (ARRAY['', 'not-an-email', 'two@@at.example',
                        'space in@mail.flashsend.test'])[1 + g %% 4]
            ELSE 'user' || g || '@mail.flashsend.test' END,
       CASE WHEN r_status < 0.03 THEN 'inactive' ELSE 'active' END,
       r_opt >= 0.10,
       (ARRAY['An', 'Binh', 'Chi', 'Dung', 'Lan', 'Minh', 'Nam', 'Thao'])[1 + g %% 8],
       CASE WHEN r_opt < 0.10 THEN now() END
  FROM (SELECT g, random() AS r_invalid, random() AS r_status, random() AS r_opt
          FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS g) AS x
ON CONFLICT (id) DO NOTHING
"""

SEED_SUPPRESSIONS = """
INSERT INTO email_suppressions (email, reason, source_event)
SELECT email, CASE WHEN id %% 3 = 0 THEN 'complaint' ELSE 'bounce' END, 'seed'
  FROM users
 WHERE id BETWEEN %(first)s AND %(last)s AND email LIKE 'user%%' AND random() < 0.015
ON CONFLICT (email) DO NOTHING
"""


# Phones for the SMS demo, written only where missing (an email-only run never pays for them):
# Vietnamese mobile numbers as people type them (`+84 9…`, normalised by the snapshot), one per
# user, and 0.2 % invalid (empty, no country code, too short, letters).
FILL_PHONES = """
UPDATE users
   SET phone = CASE WHEN id %% 500 = 7
                    THEN (ARRAY['', '0912345678', '+84 12', 'call me'])[1 + (id / 500) %% 4]
                    ELSE '+84 9' || lpad(id::text, 8, '0') END
 WHERE id <= %(upto)s AND phone IS NULL
"""


def fill_phones(dsn: str, upto: int) -> int:
    """Give users 1..`upto` without a phone the demo's number; returns rows changed."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(FILL_PHONES, {"upto": upto}).rowcount


def seed_users(dsn: str, count: int, *, seed: float = 0.42) -> SeedResult:
    """Add `count` users after the current highest id (deterministic for a given seed)."""
    with psycopg.connect(dsn, autocommit=False) as conn:
        conn.execute("SELECT setseed(%s)", (seed,))
        row = conn.execute("SELECT coalesce(max(id), 0) FROM users").fetchone()
        first = int(row[0]) + 1 if row else 1
        last = first + count - 1
        added = conn.execute(SEED_USERS, {"first": first, "last": last}).rowcount
        suppressed = conn.execute(SEED_SUPPRESSIONS, {"first": first, "last": last}).rowcount
        conn.commit()
        total_row = conn.execute("SELECT count(*) FROM users").fetchone()
        conn.execute("ANALYZE users")
        conn.commit()
        return SeedResult(added, int(total_row[0]) if total_row else 0, suppressed)
