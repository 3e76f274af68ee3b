"""The Firehose ingest path of `flashsend feedback bench`: batches of SES events POSTed to a
real webhook's /firehose as a delivery stream sends them, landed on mail.events.

The requests are built before the clock starts (the events by the stand-in's own builder,
base64 and JSON as Firehose wraps them), and sent over a few kept-alive connections, one
request at a time each (Firehose's delivery to an HTTP endpoint is a handful of concurrent
requests per stream). Reported beside the webhook's CPU per event: the load generator's CPU
and the machine's busy cores, so a reader sees what limited the run.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any
from urllib.parse import urlsplit

from flashsend.lab.feedback_run import (
    WebhookProcess,
    end_offsets,
    machine_busy_seconds,
    tree_cpu_seconds,
)
from flashsend.lab.sns_load import (
    FIREHOSE_BATCH,
    build_request,
    generator_cost,
    latency_ms,
    post_requests,
)
from flashsend.lab.sqs_bench import ses_event_bodies
from producers.firehose_endpoint import request_body, request_headers

CONCURRENCY = 8


def firehose_requests(url: str, access_key: str, events: list[str], batch: int) -> list[bytes]:
    """Ready-made delivery requests of `batch` events each (SES adds a newline to each)."""
    parts = urlsplit(url)
    out = []
    for at in range(0, len(events), batch):
        rid = str(uuid.uuid4())
        body = request_body(rid, [e.encode() + b"\n" for e in events[at : at + batch]])
        out.append(build_request(parts.netloc, parts.path, body, request_headers(rid, access_key)))
    return out


def bench_firehose_path(
    webhook: WebhookProcess,
    access_key: str,
    *,
    events: int,
    batch: int = FIREHOSE_BATCH,
    concurrency: int = CONCURRENCY,
) -> dict[str, Any]:
    """events/s and CPU per event of the /firehose route."""
    s = webhook.settings
    url = webhook.firehose_url
    warm = firehose_requests(url, access_key, ses_event_bodies(batch * 4, campaign=7), batch)
    requests = firehose_requests(url, access_key, ses_event_bodies(events, campaign=8), batch)
    asyncio.run(post_requests(url, warm, concurrency))
    before = sum(end_offsets(s, s.topic_mail_events).values())
    cpu0, busy0 = tree_cpu_seconds(webhook.proc.pid), machine_busy_seconds()
    posted = asyncio.run(post_requests(url, requests, concurrency))
    cpu = tree_cpu_seconds(webhook.proc.pid) - cpu0
    machine = machine_busy_seconds() - busy0
    landed = sum(end_offsets(s, s.topic_mail_events).values()) - before
    wall = posted.seconds
    return {
        "events_per_s": round(events / wall, 1),
        "cpu_us_per_event": round(cpu * 1e6 / events, 1),
        "processes": s.webhook_processes,
        "seconds": round(wall, 2),
        "records_per_request": batch,
        "requests": len(requests),
        "concurrency": concurrency,
        "records_on_kafka": landed,
        "request_latency_ms": latency_ms(posted.latencies),
        "cores": round(cpu / wall, 2),
        "load_generator": generator_cost(posted, events),
        "machine_busy_cores": round(machine / wall, 2),
    }
