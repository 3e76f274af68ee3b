"""Throughput and CPU of the SQS ingest path (`bench_sqs_path`, for `flashsend feedback bench`).

The queue is filled first (untimed) with realistic SES event bodies, as SNS would deliver them
with raw message delivery; then a real `flashsend events pull` process drains it onto
mail.events and is timed once the first 5 % landed (start-up is not per-event cost) until the
last: `events_per_s`, and `cpu_us_per_event` from the process's own CPU time (/proc), so other
load on the machine changes the first figure more than the second; `events_per_core_s` is
what one core of puller would ingest. The SQS server's CPU is reported apart (it is AWS's in
production; locally ElasticMQ is what limits `events_per_s`).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flashsend.lab.feedback_run import end_offsets, wait_for
from flashsend.lab.sqs_run import PullerProcess, queue_depth, with_sqs
from flashsend.settings import Settings
from infra.aws_apply import ensure_local_queues
from infra.elasticmq import ElasticMq
from infra.ses_standin.event_records import build_events
from producers.mail_topics import ensure_mail_topics
from producers.sqs_client import boto3_sqs, queue_url

# Outcomes of the synthetic mail: mostly delivered, some bounces and complaints.
_PLAN = ("delivered",) * 17 + ("bounce", "complaint", "soft_bounce")


def ses_event_bodies(count: int, *, campaign: int = 1, region: str = "us-east-1") -> list[str]:
    """`count` SES event JSON bodies (Send, Delivery, Bounce, Complaint… one recipient each),
    built by the stand-in's own event builder (pure but for uuids)."""
    bodies: list[str] = []
    now = datetime.now(UTC)
    n = 0
    while len(bodies) < count:
        n += 1
        address = f"b{n}@bench-{campaign}.flashsend.test"
        record = {
            "message_id": f"0100-{uuid.uuid4()}",
            "time": time.time(),
            "from": "Sale <sale@news.flashsend.test>",
            "destination": [address],
            "subject": "Flash sale",
            "configuration_set": "marketing",
            "tags": {"campaign": str(campaign), "seq": str(n)},
            "operation": "bulk",
        }
        plan = [(address, _PLAN[n % len(_PLAN)])]
        for _type, event in build_events(record, plan, rejected=False, now=now, region=region):
            bodies.append(json.dumps(event, separators=(",", ":")))
    return bodies[:count]


def fill(settings: Settings, bodies: list[str], threads: int = 8) -> float:
    """SendMessageBatch (10 a call) from `threads` threads; returns the seconds it took."""
    client = boto3_sqs(settings)
    url = queue_url(settings)
    batches = [bodies[i : i + 10] for i in range(0, len(bodies), 10)]

    def send(batch: list[str]) -> None:
        entries = [{"Id": str(i), "MessageBody": b} for i, b in enumerate(batch)]
        answer = client.send_message_batch(QueueUrl=url, Entries=entries)
        if answer.get("Failed"):
            raise RuntimeError(f"SendMessageBatch failed: {answer['Failed'][:2]}")

    began = time.monotonic()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(send, batches))
    return time.monotonic() - began


def _proc_cpu_s(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench_sqs_path(
    settings: Settings,
    *,
    events: int = 20_000,
    pullers: int = 8,
    timeout_s: float = 600.0,
    log_dir: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Fill a fresh queue with `events` SES events, drain it with one `events pull` process
    of `pullers` long polls, and report its throughput and CPU per event.

    `settings` should carry scratch topics (the records land on `topic_mail_events`); the
    queue is the run's own and is deleted afterwards."""
    # The run's own queue; the stand-in is not subscribed to it (the bench fills it itself).
    s = with_sqs(settings, local_services=tuple(x for x in settings.local_services if x != "ses"))
    ensure_local_queues(s)
    ensure_mail_topics(s)
    topic = s.topic_mail_events
    base = sum(end_offsets(s, topic).values())
    log(f"filling queue {s.sqs_queue} with {events:,} SES events")
    bodies = ses_event_bodies(events)
    fill_s = fill(s, bodies)
    server = ElasticMq(s).process.pid() if s.sqs_endpoint_url else None
    load0 = os.getloadavg()
    puller = PullerProcess.start(s, log_dir or s.state_dir / "sqs-bench", pullers=pullers)
    warm = max(1, events // 20)

    def landed() -> int:
        return sum(end_offsets(s, topic).values()) - base

    try:
        # Timed from the first `warm` records on: start-up (imports, connections, the JIT of
        # the SQS server) is not per-event cost.
        wait_for(f"{warm:,} records on {topic}", lambda: landed() >= warm, timeout_s, 0.02)
        cpu0, t0, n0 = puller.cpu_s(), time.monotonic(), landed()
        server_cpu0 = _proc_cpu_s(server)
        wait_for(f"{events:,} records on {topic}", lambda: landed() >= events, timeout_s, 0.05)
        wall = time.monotonic() - t0
        cpu = puller.cpu_s() - cpu0
        server_cpu1 = _proc_cpu_s(server)
        timed = events - n0
        load1 = os.getloadavg()
        time.sleep(1.0)  # a doubled record would show by now
        records = landed()
        depth = queue_depth(s)
    finally:
        summary = puller.stop()
        _delete_queues(s)
    result: dict[str, Any] = {
        "path": "sqs",
        "events": events,
        "pullers": pullers,
        "timed_events": timed,
        "events_per_s": round(timed / wall, 1),
        "cpu_us_per_event": round(cpu * 1e6 / timed, 1),
        "events_per_core_s": round(timed / cpu) if cpu else None,
        "puller_cores": round(cpu / wall, 2),
        "wall_s": round(wall, 2),
        "fill_s": round(fill_s, 1),
        "records": records,
        "duplicates": records - events,
        "left_in_queue": sum(depth.values()),
        "puller": summary,
        "load_average": [round(load0[0], 2), round(load1[0], 2)],
        "cpus": os.cpu_count(),
    }
    if server_cpu0 is not None and server_cpu1 is not None:
        server_cpu = server_cpu1 - server_cpu0
        result["sqs_server_cpu_us_per_event"] = round(server_cpu * 1e6 / timed, 1)
    log(
        f"{timed:,} events in {wall:.1f}s: {result['events_per_s']:,}/s, "
        f"{result['cpu_us_per_event']} µs CPU per event in the puller"
    )
    return result


def _delete_queues(s: Settings) -> None:
    client = boto3_sqs(s)
    for name in (s.sqs_queue, f"{s.sqs_queue}-dlq", f"{s.sqs_queue}-sns-dlq"):
        with contextlib.suppress(client.exceptions.QueueDoesNotExist):
            client.delete_queue(QueueUrl=client.get_queue_url(QueueName=name)["QueueUrl"])
