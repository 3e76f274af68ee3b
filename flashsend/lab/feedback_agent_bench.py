"""`flashsend feedback bench --agent-only`: the feedback agent alone, on a backlog it did not
have to wait for.

In a scratch database and topic of the current stack: one campaign in `sending` whose
partition holds `events` rows (nine in ten already `sent`, the rest `pending`, so the
in-doubt probe runs as it does while a campaign sends), and a backlog produced straight onto
mail.events (no webhook): a Delivery per row, a Permanent bounce every 50th, a Complaint every
1,000th, an Open every 10th, and every 100th record produced twice (a redelivery the dedupe
must absorb). Then one feedback worker starts; reported:

- `events_per_s`: records applied per second from the worker's first stored offset to the
  last (its start-up left out: that is Faust joining the group, not the agent's cost);
- `cpu_us_per_event`: the worker process's CPU over the same span, per record;
- `machine_reference_ms` before and after (flashsend.lab.bench), to compare runs of an hour;
- and what the database holds after it: the counters, which must be exact.

Reads only what the base commit's code has too, so the same file runs against it.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Any

import psycopg
from confluent_kafka import Producer

from flashsend import deliverability
from flashsend.lab.bench import machine_reference_ms
from flashsend.lab.feedback_run import (
    end_offsets,
    feedback_lag,
    scratch_settings,
    wait_for,
    with_feedback,
)
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from producers.mail_topics import ensure_mail_topics
from producers.ses_events import event_id
from schemas import serde

SCHEMA_HEADER = "flashsend.schema"
BOUNCE_EVERY, COMPLAINT_EVERY, OPEN_EVERY, TWICE_EVERY, PENDING_EVERY = 50, 1000, 10, 100, 10


def _campaign(s: Settings, rows: int) -> int:
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO campaigns (name, template, from_address, audience_condition, status,"
            " started_at, sending_since) VALUES ('agent-bench', 't', 'a@b.test', 'true',"
            " 'sending', now(), now()) RETURNING id"
        ).fetchone()
        assert row is not None
        cid = int(row[0])
        conn.execute(
            f"CREATE TABLE campaign_recipients_{cid} (LIKE campaign_recipients INCLUDING"
            f" DEFAULTS, CHECK (campaign_id = {cid}))"
        )
        conn.execute(
            f"ALTER TABLE campaign_recipients ATTACH PARTITION campaign_recipients_{cid}"
            f" FOR VALUES IN ({cid})"
        )
        conn.execute(
            "INSERT INTO users (id, email) SELECT i, 'a' || i || '@agent.flashsend.test'"
            " FROM generate_series(1, %s) i",
            (rows,),
        )
        conn.execute(
            "INSERT INTO campaign_recipients (campaign_id, seq, user_id, email, status, sent_at,"
            " message_id) SELECT %s, i, i, 'a' || i || '@agent.flashsend.test',"
            " CASE WHEN i %% %s = 0 THEN 'pending' ELSE 'sent' END, now(), 'm' || i"
            " FROM generate_series(1, %s) i",
            (cid, PENDING_EVERY, rows),
        )
        conn.execute(f"ANALYZE campaign_recipients_{cid}")
    return cid


def _records(cid: int, rows: int, ses: Any) -> list[tuple[bytes, bytes]]:
    out: list[tuple[bytes, bytes]] = []
    now_ms = int(time.time() * 1000)
    for i in range(1, rows + 1):
        to = f"a{i}@agent.flashsend.test"
        message_id = f"m{i}"
        kinds = ["Delivery"]
        if i % BOUNCE_EVERY == 0:
            kinds = ["Bounce"]
        if i % COMPLAINT_EVERY == 0:
            kinds.append("Complaint")
        if i % OPEN_EVERY == 0:
            kinds.append("Open")
        for kind in kinds:
            value = ses.encode(
                {
                    "event_id": event_id(message_id, kind, to),
                    "event_type": kind,
                    "version": 1,
                    "occurred_at": now_ms,
                    "recipient": to,
                    "ses_message_id": message_id,
                    "sns_message_id": str(uuid.uuid4()),
                    "campaign_id": cid,
                    "seq": i,
                    "configuration_set": "marketing",
                    "tags": {"campaign": str(cid)},
                    "bounce_type": "Permanent" if kind == "Bounce" else None,
                    "bounce_sub_type": "General" if kind == "Bounce" else None,
                    "complaint_type": "abuse" if kind == "Complaint" else None,
                    "detail": None,
                    "source": "event_publishing",
                    "received_at": now_ms,
                }
            )
            out.append((to.encode(), value))
            if len(out) % TWICE_EVERY == 0:
                out.append((to.encode(), value))
    return out


def _produce(s: Settings, records: list[tuple[bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": s.kafka_bootstrap, "linger.ms": 20, "acks": "all"})
    headers: list[tuple[str, str | bytes | None]] = [(SCHEMA_HEADER, b"ses_event")]
    for key, value in records:
        while True:
            try:
                producer.produce(s.topic_mail_events, key=key, value=value, headers=headers)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(60) == 0


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _applied(s: Settings) -> int:
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(next_offset), 0) FROM kafka_offsets"
            " WHERE group_id = %s AND topic = %s",
            (deliverability.feedback_app_id(s), s.topic_mail_events),
        ).fetchone()
    return int(row[0]) if row else 0


def run_agent_bench(settings: Settings, events: int, log: Any = print) -> dict[str, Any]:
    reference_before = machine_reference_ms()
    s = with_feedback(scratch_settings(settings, "agent"))
    ensure_mail_topics(s)
    rows = events * 100 // 112  # about `events` records with the bounces, opens, repeats
    cid = _campaign(s, rows)
    records = _records(cid, rows, serde.codec(s, "ses_event"))
    _produce(s, records)
    backlog = sum(end_offsets(s, s.topic_mail_events).values())
    log(f"backlog of {backlog:,} records on {s.topic_mail_events}")
    log_dir = settings.state_dir / "feedback-agent-bench"
    pool = WorkerPool(s, log_dir, loglevel="info", role="feedback")
    try:
        pool.start(1)
        proc = pool.alive()[0]
        first = wait_for("the agent's first batch", lambda: _applied(s) or None, 120, 0.01)
        t0, cpu0 = time.monotonic(), _cpu_seconds(proc.pid)
        wait_for("the agent to apply the backlog", lambda: feedback_lag(s) == 0, 900, 0.05)
        took, cpu = time.monotonic() - t0, _cpu_seconds(proc.pid) - cpu0
    finally:
        pool.stop()
    n = backlog - first
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        counters = conn.execute(
            "SELECT delivered, bounced, complained FROM campaign_feedback WHERE campaign_id = %s",
            (cid,),
        ).fetchone()
        suppressed = conn.execute("SELECT count(*) FROM email_suppressions").fetchone()
        opened = conn.execute(
            "SELECT count(*) FROM users WHERE last_open_at IS NOT NULL"
        ).fetchone()
    bounces = rows // BOUNCE_EVERY
    expect = {
        "delivered": rows - bounces,
        "bounced": bounces,
        "complained": rows // COMPLAINT_EVERY,
        "opened_users": rows // OPEN_EVERY,
    }
    got = {
        "delivered": counters[0] if counters else 0,
        "bounced": counters[1] if counters else 0,
        "complained": counters[2] if counters else 0,
        "opened_users": opened[0] if opened else 0,
    }
    return {
        "database": s.pg_database,
        "backlog_events": backlog,
        "measured_events": n,
        "seconds": round(took, 3),
        "events_per_s": round(n / took, 1),
        "cpu_us_per_event": round(cpu * 1e6 / n, 1),
        "cores": round(cpu / took, 2),
        "suppressed": suppressed[0] if suppressed else 0,
        "counters": got,
        "counters_exact": got == expect,
        "machine_reference_ms": {
            "start": reference_before,
            "end": machine_reference_ms(),
        },
    }


if __name__ == "__main__":  # the same file against another checkout: python this.py EVENTS
    import json
    import sys

    from flashsend.settings import load_settings

    print(json.dumps(run_agent_bench(load_settings(), int(sys.argv[1]), lambda m: None)))
