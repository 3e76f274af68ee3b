"""`flashsend feedback bench`: webhook throughput and the delay complaint → campaign paused.

On the current stack's Kafka and PostgreSQL, in a scratch database and topics, with a real
`flashsend webhook` process and a real feedback worker:

1. Throughput: `events` SES Delivery notifications, signed in advance by a local signer whose
   certificate this bench serves (the webhook is started with `sns_cert_authority` pointing at
   it), POSTed with `concurrency` requests in flight. Every 200 means the broker acknowledged.
   Reported: events/s, latency percentiles, CPU seconds of the webhook process.
2. The feedback worker then consumes that backlog: the agent's events/s.
3. Pause delay: `pauses` times, a campaign in `sending` whose counters sit exactly at the
   complaint threshold after the minimum sample gets one more complaint POSTed to the webhook;
   the delay is from the start of that POST until `campaigns.status` reads `paused`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

from flashsend.lab.feedback_run import (
    WebhookProcess,
    end_offsets,
    feedback_lag,
    scratch_settings,
    wait_for,
    with_feedback,
)
from flashsend.lab.mail_bench import percentile
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from infra.process import free_port
from producers.sns_sign import build_notification, generate_signing_key, sign_message

MIN_SAMPLE = 1000


@dataclass(frozen=True)
class BenchOptions:
    events: int = 20_000
    concurrency: int = 64
    pauses: int = 5


class CertServer:
    """Serves one certificate over http, as the local stack's signer does."""

    def __init__(self, pem: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.end_headers()
                self.wfile.write(pem)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def authority(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def ses_event(event_type: str, address: str, campaign: int | None) -> str:
    mail: dict[str, Any] = {
        "timestamp": "2026-05-08T12:00:01.456Z",
        "source": "sale@news.flashsend.test",
        "messageId": f"bench-{uuid.uuid4()}",
        "destination": [address],
        "tags": {"ses:configuration-set": ["marketing"]},
    }
    if campaign is not None:
        mail["tags"]["campaign"] = [str(campaign)]
    event: dict[str, Any] = {"eventType": event_type, "mail": mail}
    if event_type == "Delivery":
        event["delivery"] = {"timestamp": mail["timestamp"], "recipients": [address]}
    else:
        event["complaint"] = {
            "complainedRecipients": [{"emailAddress": address}],
            "timestamp": mail["timestamp"],
            "complaintFeedbackType": "abuse",
        }
    return json.dumps(event)


class Signer:
    def __init__(self, topic: str, cert_url: str, key_pem: bytes) -> None:
        self.topic, self.cert_url, self.key_pem = topic, cert_url, key_pem

    def body(self, message: str, version: int = 2) -> bytes:
        fields = build_notification(self.topic, message, None, self.cert_url, datetime.now(UTC))
        return json.dumps(sign_message(fields, self.key_pem, version)).encode()


async def post_all(url: str, bodies: list[bytes], concurrency: int) -> tuple[float, list[float]]:
    """POST every body; (wall seconds, per-request seconds). Raises on any non-200."""
    headers = {"x-amz-sns-message-type": "Notification", "Content-Type": "text/plain"}
    latencies: list[float] = []
    queue = list(reversed(bodies))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker() -> None:
            while queue:
                body = queue.pop()
                t0 = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    text = await response.text()
                    if response.status != 200:
                        raise RuntimeError(f"webhook answered {response.status}: {text}")
                latencies.append(time.perf_counter() - t0)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - began, latencies


def cpu_seconds(pid: int) -> float:
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_bench(
    settings: Settings, options: BenchOptions, log: Callable[[str], None] = print
) -> dict[str, Any]:
    key_pem, cert_pem = generate_signing_key()
    certs = CertServer(cert_pem)
    base = scratch_settings(settings, "bench")
    s = with_feedback(
        base,
        sns_cert_authority=certs.authority,
        feedback_min_sample=MIN_SAMPLE,
        webhook_publish_timeout_s=10.0,
    )
    signer = Signer(s.sns_topic_arns[0], f"http://{certs.authority}/bench-cert.pem", key_pem)
    log_dir = settings.state_dir / "feedback-bench"
    webhook = WebhookProcess.start(s, log_dir)
    feedback = WorkerPool(s, log_dir, loglevel="info", role="feedback")
    result: dict[str, Any] = {"database": s.pg_database, "events": options.events}
    try:
        log(f"signing {options.events:,} notifications …")
        messages = [
            ses_event("Delivery", f"b{i}@bench.flashsend.test", None) for i in range(options.events)
        ]
        with ThreadPoolExecutor(2) as pool:  # RSA signing releases the GIL
            bodies = list(pool.map(signer.body, messages, chunksize=256))
        before = sum(end_offsets(s, s.topic_mail_events).values())
        cpu0 = cpu_seconds(webhook.proc.pid)
        wall, latencies = asyncio.run(post_all(webhook.sns_url, bodies, options.concurrency))
        cpu = cpu_seconds(webhook.proc.pid) - cpu0
        produced = sum(end_offsets(s, s.topic_mail_events).values()) - before
        result["webhook"] = {
            "events_per_s": round(options.events / wall, 1),
            "seconds": round(wall, 2),
            "concurrency": options.concurrency,
            "records_on_kafka": produced,
            "latency_ms": {
                q: round(percentile(latencies, p) * 1000, 1)
                for q, p in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))
            },
            "webhook_cpu_s": round(cpu, 2),
            "cpu_ms_per_event": round(cpu * 1000 / options.events, 3),
        }
        log(f"webhook: {result['webhook']}")

        t0 = time.monotonic()
        feedback.start(1)
        wait_for("feedback worker to consume the backlog", lambda: feedback_lag(s) == 0, 600, 0.2)
        took = time.monotonic() - t0
        result["feedback_agent"] = {
            "backlog_events": produced,
            "seconds_including_start": round(took, 2),
            "events_per_s_including_start": round(produced / took, 1),
        }
        log(f"feedback agent: {result['feedback_agent']}")
        result["pause_delay_ms"] = _pause_delays(s, webhook, signer, options.pauses)
        log(f"complaint → paused: {result['pause_delay_ms']}")
        return result
    finally:
        feedback.stop()
        webhook.stop()
        certs.close()


def _pause_delays(
    s: Settings, webhook: WebhookProcess, signer: Signer, count: int
) -> dict[str, Any]:
    threshold = s.feedback_complaint_threshold
    at_threshold = int(MIN_SAMPLE * threshold)  # rate == threshold: not above it yet
    delays: list[float] = []
    acks: list[float] = []
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        for i in range(count):
            row = conn.execute(
                "INSERT INTO campaigns (name, template, from_address, audience_condition, status)"
                " VALUES (%s, 't', 'a@b.test', 'true', 'sending') RETURNING id",
                (f"bench-pause-{i}",),
            ).fetchone()
            assert row is not None
            cid = int(row[0])
            conn.execute(
                "INSERT INTO campaign_feedback (campaign_id, delivered, complained) "
                "VALUES (%s, %s, %s)",
                (cid, MIN_SAMPLE, at_threshold),
            )
            body = signer.body(ses_event("Complaint", f"c{i}@bench.flashsend.test", cid))
            t0 = time.perf_counter()
            wall, _ = asyncio.run(post_all(webhook.sns_url, [body], 1))
            acks.append(wall)

            def paused(cid: int = cid) -> bool:
                got = conn.execute("SELECT status FROM campaigns WHERE id = %s", (cid,)).fetchone()
                return got is not None and got[0] == "paused"

            wait_for(f"campaign {cid} paused", paused, 30, every=0.002)
            delays.append(time.perf_counter() - t0)
            time.sleep(0.3)  # spread the samples over the agent's batching cycle
    return {
        "samples": count,
        "median": round(percentile(delays, 50) * 1000, 1),
        "max": round(max(delays) * 1000, 1),
        "min": round(min(delays) * 1000, 1),
        "webhook_ack_median": round(percentile(acks, 50) * 1000, 1),
    }
