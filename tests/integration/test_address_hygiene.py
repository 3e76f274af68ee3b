"""One mail per mailbox, and one bad address costs only itself (real PostgreSQL, the SES
stand-in over HTTP, the sender in-process or as worker processes)."""

from __future__ import annotations

import asyncio
import random
import string
import time

import psycopg

from flashsend.cli.campaign import format_status
from flashsend.cli.control import campaign_report
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from producers.campaign import snapshot, start_campaign
from sinks.offsets import Assignment
from streams.app import Runtime
from streams.rules.addresses import is_valid_email
from tests.integration.campaign_helpers import (
    admin,
    consumed_records,
    new_campaign,
    progress,
    stats,
    statuses,
    wait_finished,
)

DOMAIN = "mail.flashsend.test"

# Addresses SES refuses for a bulk call, or our check does (a false "valid" can cost a call).
HOSTILE = [
    f'"quoted"@{DOMAIN}',
    f'"a b"@{DOMAIN}',
    f"jürgen@{DOMAIN}",
    "user@bücher.example",
    f"ctl\x01@{DOMAIN}",
    f"bell\x07@{DOMAIN}",
    f"del\x7f@{DOMAIN}",
    f"trailing-dot@{DOMAIN}.",
    "ip@[127.0.0.1]",
    "ip@127.0.0.1",
    "dotless@localhost",
    "a" * 65 + f"@{DOMAIN}",
    f"a..b@{DOMAIN}",
    f".lead@{DOMAIN}",
    f"trail.@{DOMAIN}",
    f" lead-space@{DOMAIN}",
    f"trail-space@{DOMAIN} ",
    f"\tlead-tab@{DOMAIN}",
    f"trail-newline@{DOMAIN}\n",
    f"nbsp\u00a0@{DOMAIN}",
    f"no-at.{DOMAIN}",
    f"two@@{DOMAIN}",
    f"@{DOMAIN}",
    "empty-domain@",
    "",
    "x@" + "b" * 64 + ".test",
    "x@-lead.test",
    "x@example.c0m",
    f"<bracket@{DOMAIN}>",
    f"Name <named@{DOMAIN}>",
    f"comma,a@{DOMAIN}",
    f"paren(a)@{DOMAIN}",
]

VALID_EDGES = [
    f"plain@{DOMAIN}",
    f"Mixed.Case@{DOMAIN.upper()}",
    f"o'brien+tag@{DOMAIN}",
    "a!#$%&'*+-/=?^_`{|}~b@example.com",
    "a" * 64 + f"@{DOMAIN}",
    "u@" + ".".join(["a" * 63] * 3) + ".com",
    "user@xn--bcher-kva.example",
    "user@example.XN--P1AI",
    "1234@123.example.com",
]


def _fuzz(rng: random.Random, n: int) -> list[str]:
    """Strings near the edges of the address grammar: dots, at signs, hyphens, quotes, spaces,
    control and non-ASCII characters, labels of 63/64 and local parts of 64/65 characters."""
    alphabet = "abcXY09.@-_+'\"() \t,[]\\é\x01\x7fİ"
    pieces = ["xn--", "XN--p1ai", "com", "co", "c", "1", "a" * 63, "a" * 64, "-a", "a-", ".", "@"]

    def piece() -> str:
        roll = rng.random()
        if roll < 0.3:
            return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 6)))
        if roll < 0.5:
            return rng.choice(pieces)
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 8)))

    out = []
    for _ in range(n):
        local = "".join(piece() for _ in range(rng.randint(0, 3)))
        if rng.random() < 0.1:
            local = "a" * rng.randint(60, 70)
        domain = ".".join(piece() for _ in range(rng.randint(0, 4)))
        out.append(local + rng.choice(["@", "@", "@", "", "@@"]) + domain)
    return out


def test_users_email_ok_says_what_is_valid_email_says(settings: Settings) -> None:
    """One validity check: the snapshot's (users.email_ok, computed by PostgreSQL) and the
    sender's (streams.rules.addresses.is_valid_email) agree on every address."""
    addresses = HOSTILE + VALID_EDGES + _fuzz(random.Random(17), 20_000)
    with psycopg.connect(settings.pg_dsn) as conn:
        with conn.cursor().copy("COPY users (id, email) FROM STDIN") as copy:
            for i, address in enumerate(addresses, start=1):
                copy.write_row((i, address))
        rows = conn.execute("SELECT email, email_ok FROM users ORDER BY id").fetchall()
        conn.rollback()
    assert [email for email, _ in rows] == addresses
    disagree = [(email, ok) for email, ok in rows if ok != (is_valid_email(email) is None)]
    assert disagree == []
    assert not any(ok for email, ok in rows if email in HOSTILE)
    assert all(ok for email, ok in rows if email in VALID_EDGES)
    assert sum(ok for _, ok in rows) > 500  # the fuzz reaches both sides of the line


def test_the_snapshot_keeps_one_recipient_per_mailbox(settings: Settings) -> None:
    users = [
        (1, "shared@example.com", "inactive", True),  # outside the audience: does not count
        (2, " Shared@Example.com", "active", True),  # invalid as stored: never wins
        (3, "Shared@example.com", "active", True),  # lowest id of the audience: the one mailed
        (4, "SHARED@EXAMPLE.COM", "active", True),
        (5, "shared@example.com", "active", True),
        (6, "other@example.com", "active", True),
        (7, "OTHER@example.com", "active", False),  # opted out: outside the audience
        (8, "bounced@example.com", "active", True),  # suppressed, every spelling
        (9, "Bounced@Example.com", "active", True),
        (10, '"quoted"@example.com', "active", True),
    ]
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO users (id, email, status, marketing_opt_in) VALUES (%s, %s, %s, %s)",
                users,
            )
        conn.execute(
            "INSERT INTO email_suppressions (email, reason) "
            "VALUES ('bounced@example.com', 'bounce')"
        )
        cid = new_campaign(settings)
        assert snapshot(conn, cid, settings.audience_condition) == 6
        rows = conn.execute(
            "SELECT seq, user_id, status, reason FROM campaign_recipients WHERE campaign_id = %s "
            "ORDER BY seq",
            (cid,),
        ).fetchall()
        report = campaign_report(conn, cid)
    assert rows == [
        (1, 2, "skipped", "invalid_email"),
        (2, 3, "pending", None),
        (3, 4, "skipped", "duplicate_address"),
        (4, 5, "skipped", "duplicate_address"),
        (5, 6, "pending", None),
        (6, 10, "skipped", "invalid_email"),
    ]
    assert statuses(settings, cid) == {"pending": 2, "skipped": 4}  # counters agree with rows
    p = progress(settings, cid)
    assert (p["duplicate_addresses"], p["invalid_addresses"]) == (2, 2)
    assert "(at snapshot: 2 duplicate address(es), 2 invalid)" in format_status(p)
    assert {"status": "skipped", "reason": "duplicate_address", "count": 2} in report[
        "by_status_reason"
    ]


def _refused_address(i: int) -> str:
    return f"refuse-me-{i}@{DOMAIN}"


def test_hostile_addresses_in_the_same_calls_cost_only_themselves(settings: Settings) -> None:
    """Valid and hostile recipients share SES calls. Hostile users are set aside by the
    snapshot; hostile addresses that got into recipient rows anyway (a snapshot taken with a
    looser check) are skipped by the sender before any call; addresses our check accepts but
    SES refuses (the stand-in's `refuse_addresses` fault) make SES refuse whole calls, which
    the sender splits until only they fail, with SES's message. Every valid recipient is sent,
    once."""
    rng = random.Random(5)
    users: list[tuple[int, str]] = []
    for i in range(1, 401):
        users.append((i, f"u{i}@{DOMAIN}"))
    refused_ids = {37, 38, 120, 333}  # two side by side: two culprits in one call
    for i in refused_ids:
        users[i - 1] = (i, _refused_address(i))
    next_id = 401
    for address in HOSTILE:  # interleaved by id with the valid users' rows
        users.append((next_id, address))
        next_id += 1
    for i in (3, 4, 5):  # case and whitespace variants of valid users, higher ids
        users.append((next_id, f"U{i}@{DOMAIN.upper()}"))
        users.append((next_id + 1, f" u{i}@{DOMAIN} "))
        next_id += 2
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO users (id, email) VALUES (%s, %s)", users)
        cid = new_campaign(settings, rate=0)
        snapshot(conn, cid, settings.audience_condition)
        # Rows that slipped past the snapshot: the sender must still keep them out of calls.
        planted = {
            seq: address
            for seq, address in zip(
                sorted(rng.sample(range(1, 401), len(HOSTILE))), HOSTILE, strict=True
            )
            if seq not in refused_ids
        }
        with conn.cursor() as cur:
            cur.executemany(
                "UPDATE campaign_recipients SET email = %s WHERE campaign_id = %s AND seq = %s",
                [(address, cid, seq) for seq, address in planted.items()],
            )
        pending = conn.execute(
            "SELECT seq, user_id FROM campaign_recipients WHERE campaign_id = %s "
            "AND status = 'pending' ORDER BY seq",
            (cid,),
        ).fetchall()
    assert len(pending) == 400  # the hostile users and the variants were set aside

    async def scenario() -> dict[str, int]:
        runtime = Runtime(settings)
        try:
            await runtime.offsets(Assignment.of(settings.topic_recipients, [0]))
            sender = await runtime.ensure_started()
            await sender.reassign({0})
            await sender.handle(consumed_records(settings, cid, 0, pending))
            deadline = time.monotonic() + 60
            while (left := statuses(settings, cid)).get("pending", 0) + left.get("sending", 0):
                assert time.monotonic() < deadline, left
                await asyncio.sleep(0.2)
            return dict(sender.stats)
        finally:
            await runtime.stop()

    ses = admin(settings)
    ses.set_faults(refuse_addresses="^refuse-me-")
    try:
        sender_stats = asyncio.run(scenario())
    finally:
        ses.set_faults(refuse_addresses="")

    with psycopg.connect(settings.pg_dsn) as conn:
        rows = conn.execute(
            "SELECT seq, user_id, email, status, reason FROM campaign_recipients "
            "WHERE campaign_id = %s ORDER BY seq",
            (cid,),
        ).fetchall()
    by_seq = {seq: (user_id, email, status, reason) for seq, user_id, email, status, reason in rows}
    sent = {seq for seq, (_, _, status, _) in by_seq.items() if status == "sent"}
    for seq, address in planted.items():
        problem = is_valid_email(address)
        assert by_seq[seq][2:] == ("skipped", f"invalid_email:{problem}"), (seq, address)
    for seq in refused_ids:
        status, reason = by_seq[seq][2:]
        assert status == "failed", (seq, status, reason)
        assert reason == (
            "BadRequestException: Illegal address: "
            f"'{_refused_address(seq)}' in BulkEmailEntries[{_entry_index(reason)}].Destination."
        )
    assert sent == set(range(1, 401)) - set(planted) - refused_ids
    set_aside = [by_seq[seq][2:] for seq in by_seq if seq > 400]  # the hostile users, variants
    assert len(set_aside) == len(HOSTILE) + 6
    assert set(set_aside) == {("skipped", "invalid_email"), ("skipped", "duplicate_address")}
    counted = stats(settings, cid)
    assert counted["duplicates"] == 0
    assert counted["accepted"] == len(sent)
    mailed = {m["destination"][0] for m in ses.messages(campaign=str(cid), limit=1000)}
    assert mailed == {f"u{by_seq[s][0]}@{DOMAIN}" for s in sent}
    # The refused calls were split, and the calls that went were the valid ones' only.
    assert sender_stats["refused_calls"] >= len(refused_ids)
    assert sender_stats["failed"] == len(refused_ids)


def _entry_index(reason: str | None) -> str:
    """The entry number SES named in its message (its place in the refused call)."""
    assert reason is not None and "BulkEmailEntries[" in reason, reason
    return reason.split("BulkEmailEntries[", 1)[1].split("]", 1)[0]


def test_case_and_space_variants_of_one_address_get_one_mail(settings: Settings) -> None:
    """The whole path (snapshot, Kafka, worker processes, the stand-in): users whose addresses
    differ only in case or surrounding spaces are one mailbox, mailed once."""
    variants = [
        "shared@example.com",
        "Shared@example.com",
        "SHARED@EXAMPLE.COM",
        " shared@example.com ",
    ]
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO users (id, email) VALUES (%s, %s)",
            [(i, f"solo{i}@example.com") for i in range(1, 101)]
            + [(1000 + i, address) for i, address in enumerate(variants)],
        )
    cid = new_campaign(settings, rate=0)
    pool = WorkerPool(settings, settings.state_dir / f"logs-{cid}")
    start_campaign(settings, cid)
    pool.start(1)
    try:
        finished = wait_finished(settings, cid, pool)
    finally:
        pool.stop()
    assert (finished["sent"], finished["skipped"], finished["failed"]) == (101, 3, 0)
    counted = stats(settings, cid)
    assert counted["duplicates"] == 0 and counted["accepted"] == 101
    to_shared = [
        m
        for m in admin(settings).messages(destination="shared@example.com", limit=100)
        if m["tags"].get("campaign") == str(cid)
    ]
    assert [m["destination"] for m in to_shared] == [["shared@example.com"]]
