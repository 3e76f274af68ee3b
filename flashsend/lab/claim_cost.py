"""What one recipient's claim costs: the sender's claim transaction (fenced offset advance,
claim statement and, for a campaign with a promo pool, the code binding) through the real
`RecipientStore`, on PostgreSQL only (no Kafka, no SES).

    python -m flashsend.lab.claim_cost --users 20000 [--promo] [--chunk 500] [--repeat 3]

Settings come from FLASHSEND_* as for every command (a running PostgreSQL with the
migrations applied). Each repeat snapshots a new campaign of the first --users users and
claims all its recipients in claim transactions of --chunk keys (25 per record, as doorbells
carry them). Prints one JSON object: per repeat, µs per claimed recipient of wall time, of
this process's CPU (client) and of the PostgreSQL backend's CPU (read from /proc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from flashsend.settings import Settings, load_settings
from producers.campaign import snapshot
from producers.campaign_ops import create_campaign
from sinks.offsets import Assignment, PartitionSpan
from sinks.recipient_store import RecipientStore
from sinks.users import seed_users

PER_RECORD = 25
TICKS = os.sysconf("SC_CLK_TCK")


def backend_cpu_s(pid: int) -> float:
    """utime + stime of a PostgreSQL backend (fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def prepare(settings: Settings, users: int, promo: bool) -> tuple[int, list[int]]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM users").fetchone()
        have = int(row[0]) if row else 0
    if have < users:
        seed_users(settings.pg_dsn, users - have)
    audience = f"({settings.audience_condition}) AND u.id <= {users}"
    cid = create_campaign(settings, name=f"claim-cost-{time.time():.0f}", audience=audience)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        if promo:
            from sinks.promo_store import PromoStore
            from streams.rules.promo_codes import parse_pattern

            PromoStore(conn).generate(cid, parse_pattern("{10}"), users)
        snapshot(conn, cid, settings.audience_condition)
        seqs = [
            int(r[0])
            for r in conn.execute(
                "SELECT seq FROM campaign_recipients WHERE campaign_id = %s "
                "AND status = 'pending' ORDER BY seq",
                (cid,),
            )
        ]
        if promo:
            conn.execute("VACUUM ANALYZE promo_codes")
    return cid, seqs


async def claim_all(settings: Settings, cid: int, seqs: list[int], chunk: int) -> dict[str, Any]:
    pool = AsyncConnectionPool(
        settings.pg_dsn, min_size=1, max_size=1, open=False, kwargs={"autocommit": True}
    )
    await pool.open(wait=True, timeout=30)
    try:
        topic = f"claim-cost-{cid}"
        store = RecipientStore(pool, group_id="claim-cost", topic=topic)
        await store.offsets.take(Assignment.of(topic, [0]))
        async with pool.connection() as conn:
            row = await (await conn.execute("SELECT pg_backend_pid()")).fetchone()
            assert row is not None
            backend = int(row[0])
        # Warm-up: the first claim plans the statements and fills the store's caches.
        first, rest = seqs[:PER_RECORD], seqs[PER_RECORD:]
        await store.claim_batch([PartitionSpan(0, 0, 0)], {0: [(0, (cid, s)) for s in first]})
        offset = 1
        claimed = 0
        server0, client0, wall0 = backend_cpu_s(backend), time.process_time(), time.perf_counter()
        for i in range(0, len(rest), chunk):
            part = rest[i : i + chunk]
            keys = []
            for j in range(0, len(part), PER_RECORD):
                keys += [(offset, (cid, s)) for s in part[j : j + PER_RECORD]]
                offset += 1
            outcome = await store.claim_batch(
                [PartitionSpan(0, keys[0][0], keys[-1][0])], {0: keys}
            )
            claimed += len(outcome.claimed)
        wall = time.perf_counter() - wall0
        client = time.process_time() - client0
        server = backend_cpu_s(backend) - server0
    finally:
        await pool.close()
    per = 1e6 / max(claimed, 1)
    return {
        "claimed": claimed,
        "wall_us_per_recipient": round(wall * per, 1),
        "client_cpu_us_per_recipient": round(client * per, 1),
        "server_cpu_us_per_recipient": round(server * per, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, prog="python -m flashsend.lab.claim_cost")
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--promo", action="store_true", help="campaigns with a promo pool")
    parser.add_argument("--chunk", type=int, default=500, help="keys per claim transaction")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    settings = load_settings()
    runs = []
    for _ in range(args.repeat):
        cid, seqs = prepare(settings, args.users, args.promo)
        runs.append(asyncio.run(claim_all(settings, cid, seqs, args.chunk)))
    print(json.dumps({"promo": args.promo, "chunk": args.chunk, "runs": runs}))


if __name__ == "__main__":
    main()
