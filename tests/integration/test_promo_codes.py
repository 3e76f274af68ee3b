"""Promo code pools (sinks/sql/promo.sql, sinks/recipient_store.py): a code is bound to a
recipient in the claim's transaction, never to two recipients, a recipient never holds two
(re-claims keep theirs), and an empty pool pauses the campaign with nothing sent codeless.

Stores on the real PostgreSQL (two RecipientStores with pools of their own = two workers),
real worker processes and the SES stand-in where the test is about what was mailed."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import psycopg

from flashsend.cli.entry import main as cli_main
from flashsend.lab.chaos import ChaosOptions, run_chaos
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings, settings_env
from producers.campaign import snapshot, start_campaign
from producers.campaign_ops import (
    PROMO_HTML,
    PROMO_SUBJECT,
    PROMO_TEMPLATE,
    PROMO_TEXT,
    control_campaign,
    create_campaign,
)
from sinks.offsets import Assignment, PartitionSpan
from sinks.promo_store import PromoStore
from sinks.queries import query
from sinks.recipient_store import ClaimedRecipient, RecipientStore, RowResult
from sinks.ses import SesSender, make_client
from sinks.users import seed_users
from streams.rules.promo_codes import parse_pattern
from tests.integration.campaign_helpers import pending_seqs, stats, statuses, wait_finished
from tests.integration.mail_fixtures import open_pool, run

GROUP = "promo"


def promo_campaign(settings: Settings, users: int, codes: int, *, start: bool = False) -> int:
    """A campaign with a pool of `codes` generated codes; snapshotted (sending, no doorbell),
    or started (produced) with `start`."""
    seed_users(settings.pg_dsn, users)
    SesSender(make_client(settings, timeout=10)).put_template(
        PROMO_TEMPLATE, PROMO_SUBJECT, PROMO_HTML, PROMO_TEXT
    )
    cid = create_campaign(settings, name="promo", template=PROMO_TEMPLATE, rate=0.0)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        PromoStore(conn).generate(cid, parse_pattern("T-{8}"), codes)
        if not start:
            snapshot(conn, cid, settings.audience_condition)
    if start:
        start_campaign(settings, cid)
    return cid


def check(settings: Settings, cid: int) -> dict[str, int]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return PromoStore(conn).check(cid)


def campaign_row(settings: Settings, cid: int) -> tuple[str, str | None]:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT status, reason FROM campaigns WHERE id = %s", (cid,)).fetchone()
    assert row is not None
    return str(row[0]), row[1]


class Worker:
    """A RecipientStore owning some partitions, as a worker process would."""

    def __init__(self, store: RecipientStore) -> None:
        self.store = store
        self.offset: dict[int, int] = {}

    async def claim(self, keys: dict[int, list[tuple[int, int]]]) -> list[ClaimedRecipient]:
        """One claim transaction: each partition's keys as one record at its next offset."""
        spans, offered = [], {}
        for partition, ks in keys.items():
            at = self.offset.get(partition, 0)
            self.offset[partition] = at + 1
            spans.append(PartitionSpan(partition, at, at))
            offered[partition] = [(at, key) for key in ks]
        outcome = await self.store.claim_batch(spans, offered)
        return outcome.claimed


async def workers(settings: Settings, n: int, topic: str) -> tuple[list[Worker], list[Any]]:
    pools = [await open_pool(settings, size=2) for _ in range(n)]
    made = []
    for i, pool in enumerate(pools):
        store = RecipientStore(pool, group_id=GROUP, topic=topic)
        await store.offsets.take(Assignment.of(topic, [i]))
        made.append(Worker(store))
    return made, pools


def test_two_workers_claiming_at_once_never_bind_a_code_twice(settings: Settings) -> None:
    """Two workers race for the SAME rows (two doorbells of one recipient on two
    partitions), then claim their own partitions' recipients in concurrent transactions, 25
    at a time. The pool holds exactly one code per recipient, so the last rounds compete for
    the last free codes. Every claimed recipient
    gets a code, none twice, no code is bound to a row its transaction did not claim, and
    the pool is not found empty while it still has codes."""
    cid = promo_campaign(settings, 1_200, 1)
    seqs = pending_seqs(settings, cid)
    assert len(seqs) > 1_000
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        # Exactly one code per recipient: the last claims compete for the last free codes.
        PromoStore(conn).generate(cid, parse_pattern("T-{8}"), len(seqs) - 1)
    split, shared = seqs[:-200], seqs[-200:]

    async def scenario() -> list[ClaimedRecipient]:
        (a, b), pools = await workers(settings, 2, f"t{cid}")
        try:
            claimed: list[ClaimedRecipient] = []
            for i in range(0, len(shared), 25):
                chunk = [(cid, s) for s in shared[i : i + 25]]
                for rows in await asyncio.gather(a.claim({0: chunk}), b.claim({1: chunk})):
                    claimed += rows
            mine, theirs = split[0::2], split[1::2]
            for i in range(0, max(len(mine), len(theirs)), 25):
                for rows in await asyncio.gather(
                    a.claim({0: [(cid, s) for s in mine[i : i + 25]]}),
                    b.claim({1: [(cid, s) for s in theirs[i : i + 25]]}),
                ):
                    claimed += rows
            return claimed
        finally:
            for pool in pools:
                await pool.close()

    claimed = run(scenario())
    assert len(claimed) == len(seqs), "a row was claimed twice, or not at all"
    assert all(r.promo_code for r in claimed), "a claimed recipient got no code"
    codes = [r.promo_code for r in claimed]
    assert len(set(codes)) == len(codes), "a code was handed out twice"
    db = check(settings, cid)
    assert db["bound"] == db["distinct_codes"] == db["holders"] == len(seqs)
    assert db["holding_two"] == 0
    assert campaign_row(settings, cid) == ("sending", None)


def test_a_reclaimed_recipient_keeps_its_code(settings: Settings) -> None:
    """Rows claimed, then put back to pending every way the system does it — a drain's
    release, a lease expired before the call (a killed worker), an unknown row resent — are
    claimed again, by another worker: each keeps the code of its first claim."""
    cid = promo_campaign(settings, 80, 200)
    seqs = pending_seqs(settings, cid)[:60]
    drained, expired, unknown = seqs[:20], seqs[20:40], seqs[40:60]

    async def scenario() -> tuple[dict[int, str | None], dict[int, str | None]]:
        (a, b), pools = await workers(settings, 2, f"t{cid}")
        try:
            first = await a.claim({0: [(cid, s) for s in seqs]})
            by_seq = {r.seq: r for r in first}
            back = [by_seq[s] for s in drained]
            await a.store.record_results(
                cid,
                [RowResult(r.seq, "pending", "drain", None) for r in back],
                [r.attempt for r in back],
            )
            gone = [by_seq[s] for s in unknown]
            await a.store.enter_call(cid, gone)
            await a.store.record_results(
                cid,
                [RowResult(r.seq, "unknown", "timeout", None) for r in gone],
                [r.attempt for r in gone],
            )
            with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
                # The rows still 'sending' never entered a call: their lease ends, pending.
                expired_now = conn.execute(
                    query("expire_leases"), {"campaign_id": cid, "lease_s": 0}
                ).rowcount
                assert expired_now == len(expired)
                moved = conn.execute(
                    query("resend_unknown"),
                    {
                        "campaign_id": cid,
                        "seqs": unknown,
                        "older_than_s": 0,
                        "requested_by": "test",
                        "host": socket.gethostname(),
                        "reason": "test",
                    },
                ).fetchone()
                assert moved is not None and moved[1] == len(unknown)
            again = await b.claim({1: [(cid, s) for s in seqs]})
            return (
                {r.seq: r.promo_code for r in first},
                {r.seq: r.promo_code for r in again},
            )
        finally:
            for pool in pools:
                await pool.close()

    first, again = run(scenario())
    assert set(again) == set(seqs)
    assert again == first
    db = check(settings, cid)
    assert db["bound"] == db["holders"] == len(seqs) and db["holding_two"] == 0


def test_an_empty_pool_pauses_the_campaign_and_nothing_goes_out_without_a_code(
    settings: Settings,
) -> None:
    """A real worker: 10 codes for ~25 recipients. The campaign pauses, reason
    promo_pool_empty; SES got at most the 10 mails with a code, each with its own; the other
    rows wait as pending. 25 more codes and a resume finish it: every mail carried a code, each code
    went to one address, `campaign status` shows the codes issued and left."""
    cid = promo_campaign(settings, 30, 10, start=True)
    recipients = len(pending_seqs(settings, cid))
    assert recipients > 10
    pool = WorkerPool(settings, Path(settings.state_dir) / "logs" / f"promo-{cid}")
    try:
        pool.start(1)
        until = time.monotonic() + 90
        while campaign_row(settings, cid)[0] != "paused":
            assert time.monotonic() < until, statuses(settings, cid)
            assert pool.alive()
            time.sleep(0.3)
        assert campaign_row(settings, cid) == ("paused", "promo_pool_empty")
        while statuses(settings, cid).get("sending"):  # lanes release what they held
            assert time.monotonic() < until
            time.sleep(0.3)
        # The 10 recipients with a code went out, or wait (their lane saw the pause first).
        at_ses = stats(settings, cid)
        assert at_ses["accepted"] == at_ses["promo_codes"] <= 10
        assert at_ses["promo_code_conflicts"] == 0
        counts = statuses(settings, cid)
        assert counts.get("sent", 0) + counts["pending"] == recipients, counts
        assert counts.get("sent", 0) == at_ses["accepted"]
        db = check(settings, cid)
        assert db["bound"] == 10 and db["sent_without_code"] == 0
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            PromoStore(conn).generate(cid, parse_pattern("T-{8}"), 25)
        control_campaign(settings, cid, "resume", None)
        wait_finished(settings, cid, pool, timeout=90)
    finally:
        pool.stop()
    at_ses = stats(settings, cid)
    assert at_ses["accepted"] == recipients == at_ses["promo_codes"]
    assert at_ses["promo_code_destinations"] == recipients
    assert at_ses["promo_code_conflicts"] == 0 and at_ses["duplicates"] == 0
    db = check(settings, cid)
    assert db["bound"] == db["distinct_codes"] == recipients and db["sent_without_code"] == 0
    code, out = _cli(settings, "campaign", "status", str(cid), "--json")
    assert code == 0
    status = json.loads(out.strip().splitlines()[-1])
    issued_left = (status["promo_codes_issued"], status["promo_codes_left"])
    assert issued_left == (recipients, 35 - recipients)


def test_campaigns_without_a_pool_claim_as_before(settings: Settings) -> None:
    """No pool: no code, no promo statement, nothing bound."""
    seed_users(settings.pg_dsn, 50)
    SesSender(make_client(settings, timeout=10)).put_template(
        PROMO_TEMPLATE, PROMO_SUBJECT, PROMO_HTML, PROMO_TEXT
    )
    cid = create_campaign(settings, name="plain", rate=0.0)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        snapshot(conn, cid, settings.audience_condition)
        assert PromoStore(conn).counts(cid) is None
    seqs = pending_seqs(settings, cid)

    async def scenario() -> list[ClaimedRecipient]:
        (a,), pools = await workers(settings, 1, f"t{cid}")
        try:
            return await a.claim({0: [(cid, s) for s in seqs]})
        finally:
            await pools[0].close()

    claimed = run(scenario())
    assert len(claimed) == len(seqs) and all(r.promo_code is None for r in claimed)


def test_import_refuses_a_bad_file_whole_and_a_started_campaign_without_a_pool(
    settings: Settings, tmp_path: Path
) -> None:
    seed_users(settings.pg_dsn, 20)
    cid = create_campaign(settings, name="imp", rate=0.0)
    good = tmp_path / "good.txt"
    good.write_text("AAA-1\nAAA-2\n\nAAA-3\n")
    dup = tmp_path / "dup.txt"
    dup.write_text("B1\nB2\nB1\n")
    overlap = tmp_path / "overlap.txt"
    overlap.write_text("C1\nAAA-2\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    code, out = _cli(settings, "promo", "import", str(cid), str(good), "--json")
    assert code == 0 and json.loads(out)["imported"] == 3
    for bad, message in (
        (dup, "repeats line 1"),
        (overlap, "already in campaign"),
        (empty, "holds no code"),
    ):
        code, err = _cli(settings, "promo", "import", str(cid), str(bad), stderr=True)
        assert code == 2 and message in err and "nothing imported" in err
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        assert PromoStore(conn).counts(cid) is not None
        codes = [r[0] for r in conn.execute("SELECT code FROM promo_codes ORDER BY code")]
    assert codes == ["AAA-1", "AAA-2", "AAA-3"]  # nothing of the bad files went in
    plain = create_campaign(settings, name="plain", rate=0.0)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        snapshot(conn, plain, settings.audience_condition)
    code, err = _cli(settings, "promo", "generate", str(plain), "--count", "5", stderr=True)
    assert code == 2 and "without a promo pool" in err
    code, err = _cli(
        settings, "promo", "generate", str(cid), "--count", "5", "--pattern", "{1}", stderr=True
    )
    assert code == 2 and "lengthen a random run" in err


def _cli(settings: Settings, *argv: str, stderr: bool = False) -> tuple[int, str]:
    """Run the command line in this process with the test's settings in the environment."""
    out, err = io.StringIO(), io.StringIO()
    saved = dict(os.environ)
    os.environ.update(settings_env(settings))
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(list(argv))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return code, err.getvalue() if stderr else out.getvalue()


def test_chaos_with_promo_codes_and_kills_keeps_codes_unique(settings: Settings) -> None:
    """A short chaos run: workers SIGKILLed mid-campaign (rows in calls end unknown, rows
    claimed but not in a call are claimed again by the next owner with their code)."""
    result = run_chaos(
        settings,
        ChaosOptions(
            users=3_000,
            workers=2,
            rate=300,
            kill_every_s=3.0,
            lease_s=6,
            timeout_s=150,
            events_wait_s=0,
            promo_codes=True,
        ),
        log=print,
    )
    print(json.dumps(result, indent=1, sort_keys=True))
    assert "error" not in result, result["error"]
    assert result["kills"] >= 1
    assert result["invariants"]["promo_codes_unique"] is True
    assert result["invariants_failed"] == [], json.dumps(result, default=str)
    assert result["promo_codes_issued"] >= result["sent"] > 0
    assert result["promo_codes_sent_without_code"] == 0
