"""`flashsend feedback bench`: how fast each ingest path takes SES events in, at what CPU cost,
and the delay complaint → campaign paused.

On the current stack's Kafka and PostgreSQL, in a scratch database and topics, with a real
`flashsend webhook` (one process per CPU unless told: `bench_processes`) and a real feedback
worker:

1. Ingest, per path. The SNS webhook: `events` SES Delivery notifications, signed in
   advance by a local signer whose certificate this bench serves (the webhook is started with
   `sns_cert_authority` pointing at it), POSTed over `concurrency` kept-alive connections, one
   request at a time each, as SNS does (`flashsend.lab.sns_load`). Every 200 means the broker
   acknowledged. Reported: events/s, latency percentiles, and the CPU time per event of the
   webhook processes — the figure that does not depend on what else the machine runs — beside
   the load generator's own CPU and the machine's other load, so a reader can tell whether the
   webhook or the machine was the limit. The SQS path (`flashsend.lab.sqs_bench`): a queue
   filled with `events` raw SES events, drained by a real `flashsend events pull` onto its
   own topic; the puller's CPU per event, the SQS server's apart (AWS's in production). The
   stack's ElasticMQ when it runs, else one the bench starts in memory and stops.
   The top level's `events_per_s` and `cpu_us_per_event` are the faster path's.
2. The feedback worker then consumes that backlog: the agent's events/s.
3. Pause delay: `pauses` times, a campaign in `sending` whose counters sit exactly at the
   complaint threshold after the minimum sample gets one more complaint POSTed to the webhook;
   the delay is from the start of that POST until `campaigns.status` reads `paused`.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
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

import psycopg
from pydantic import SecretStr

from flashsend import deliverability
from flashsend.lab.feedback_run import (
    WebhookProcess,
    end_offsets,
    feedback_lag,
    machine_busy_seconds,
    scratch_settings,
    tree_cpu_seconds,
    wait_for,
    with_feedback,
)
from flashsend.lab.firehose_bench import bench_firehose_path
from flashsend.lab.mail_bench import percentile
from flashsend.lab.sns_load import (
    CONCURRENCY,
    FIREHOSE_BATCH,
    generator_cost,
    latency_ms,
    post_all,
)
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from infra.process import free_port
from producers.sns_sign import build_notification, generate_signing_key, sign_message

MIN_SAMPLE = 1000


WARM_UP_EVENTS = 200  # per process: certificate fetch, producer connection, first batches


@dataclass(frozen=True)
class BenchOptions:
    events: int = 20_000
    concurrency: int = CONCURRENCY
    pauses: int = 5
    processes: int | None = None  # webhook processes; None: `bench_processes`
    agent: bool = True  # also measure the feedback agent and the complaint → pause delay
    sqs: bool = True  # also measure the SQS path (events pull)
    firehose: bool = True  # also measure the Firehose path (batches POSTed to /firehose)
    firehose_batch: int = FIREHOSE_BATCH  # records per Firehose request
    pullers: int = 8  # concurrent long polls of the SQS path's puller


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


def running_services(settings: Settings) -> list[str]:
    """The local stack's services that answer (the in-process mock:// registry is not one)."""
    from infra.stack import Stack

    mock_registry = settings.schema_registry_url.startswith("mock://")
    return [
        status.name
        for status in Stack(settings).status()
        if status.running and not (mock_registry and status.name == "registry")
    ]


def bench_processes(settings: Settings, cpus: int | None = None) -> int:
    """Webhook processes for the bench: FLASHSEND_WEBHOOK_PROCESSES when set, else one per
    CPU. The bench measures what a path takes in on this machine with nothing else running;
    `flashsend webhook` defaults to half the CPUs because the rest of the stack runs beside it."""
    if settings.webhook_processes:
        return deliverability.webhook_processes(settings)
    return max(1, cpus or os.cpu_count() or 1)


def run_bench(
    settings: Settings, options: BenchOptions, log: Callable[[str], None] = print
) -> dict[str, Any]:
    key_pem, cert_pem = generate_signing_key()
    firehose_key = secrets.token_urlsafe(24)
    certs = CertServer(cert_pem)
    base = scratch_settings(settings, "bench")
    processes = options.processes or bench_processes(settings)
    s = with_feedback(
        base,
        sns_cert_authority=certs.authority,
        feedback_min_sample=MIN_SAMPLE,
        webhook_publish_timeout_s=10.0,
        webhook_processes=processes,
        firehose_access_keys=SecretStr(firehose_key),
    )
    signer = Signer(s.sns_topic_arns[0], f"http://{certs.authority}/bench-cert.pem", key_pem)
    log_dir = settings.state_dir / "feedback-bench"
    webhook = WebhookProcess.start(s, log_dir)
    feedback = WorkerPool(s, log_dir, loglevel="info", role="feedback")
    result: dict[str, Any] = {"database": s.pg_database, "events": options.events}
    try:
        warm_up = WARM_UP_EVENTS * processes
        log(f"signing {options.events + warm_up:,} notifications …")
        messages = [
            ses_event("Delivery", f"b{i}@bench.flashsend.test", None)
            for i in range(options.events + warm_up)
        ]
        with ThreadPoolExecutor(2) as pool:  # RSA signing releases the GIL
            bodies = list(pool.map(signer.body, messages, chunksize=256))
        asyncio.run(post_all(webhook.sns_url, bodies[:warm_up], options.concurrency))
        before = sum(end_offsets(s, s.topic_mail_events).values())
        load_before = os.getloadavg()[0]
        cpu0, busy0 = tree_cpu_seconds(webhook.proc.pid), machine_busy_seconds()
        posted = asyncio.run(post_all(webhook.sns_url, bodies[warm_up:], options.concurrency))
        cpu = tree_cpu_seconds(webhook.proc.pid) - cpu0
        busy = machine_busy_seconds() - busy0
        produced = sum(end_offsets(s, s.topic_mail_events).values()) - before
        wall, n = posted.seconds, options.events
        path = {
            "events_per_s": round(n / wall, 1),
            "cpu_us_per_event": round(cpu * 1e6 / n, 1),
            "processes": processes,
            "seconds": round(wall, 2),
            "concurrency": options.concurrency,
            "records_on_kafka": produced,
            "latency_ms": latency_ms(posted.latencies),
            "cores": round(cpu / wall, 2),
            "load_generator": generator_cost(posted, n),
        }
        result["paths"] = {"webhook": path}
        result["machine"] = {
            "cpus": os.cpu_count(),
            "busy_cores": round(busy / wall, 2),
            # Everything else the machine ran meanwhile: broker, PostgreSQL, other people's.
            "other_cores": round((busy - cpu - posted.cpu_s) / wall, 2),
            "load_average_before": round(load_before, 2),
            "load_average_after": round(os.getloadavg()[0], 2),
        }
        result["services"] = {
            "stack": running_services(settings),
            "webhook_processes": processes,
            "feedback_workers": 1 if options.agent else 0,
            "ses_standin_emitter": "not used: the bench signs and POSTs its own notifications",
        }
        log(f"webhook: {path}")
        log(f"machine: {result['machine']}")
        if options.firehose:
            fh = bench_firehose_path(
                webhook,
                firehose_key,
                events=options.events,
                batch=options.firehose_batch,
            )
            result["paths"]["firehose"] = fh
            log(f"firehose: {fh}")
        if options.sqs:
            result["paths"]["sqs"] = _sqs_path(s, options, log_dir, log)
            result["services"]["sqs_server"] = result["paths"]["sqs"]["sqs_server"]
        best = max(result["paths"], key=lambda name: result["paths"][name]["events_per_s"])
        result["best_path"] = best
        result["events_per_s"] = result["paths"][best]["events_per_s"]
        result["cpu_us_per_event"] = result["paths"][best]["cpu_us_per_event"]
        if not options.agent:
            return result

        t0 = time.monotonic()
        feedback.start(1)
        wait_for("feedback worker to consume the backlog", lambda: feedback_lag(s) == 0, 600, 0.2)
        took = time.monotonic() - t0
        backlog = sum(end_offsets(s, s.topic_mail_events).values())  # every path's records
        result["feedback_agent"] = {
            "backlog_events": backlog,
            "seconds_including_start": round(took, 2),
            "events_per_s_including_start": round(backlog / took, 1),
        }
        log(f"feedback agent: {result['feedback_agent']}")
        result["pause_delay_ms"] = _pause_delays(s, webhook, signer, options.pauses)
        log(f"complaint → paused: {result['pause_delay_ms']}")
        return result
    finally:
        feedback.stop()
        webhook.stop()
        certs.close()


def _sqs_path(
    s: Settings, options: BenchOptions, log_dir: Path, log: Callable[[str], None]
) -> dict[str, Any]:
    """The SQS path on its own topic (the feedback agent's figures stay the webhook's), on the
    stack's ElasticMQ or, when none answers, one started for the run."""
    from flashsend.lab.sqs_bench import bench_sqs_path
    from infra.elasticmq import ElasticMq

    own = s.model_copy(update={"topic_mail_events": s.topic_mail_events + "-sqs"})
    started: ElasticMq | None = None
    if not (s.sqs_endpoint_url and ElasticMq(s).ready()):
        port = free_port()
        own = own.model_copy(
            update={
                "sqs_port": port,
                "sqs_endpoint": f"http://127.0.0.1:{port}",
                "sqs_persist": False,
                "state_dir": log_dir / "sqs-server",
            }
        )
        started = ElasticMq(own)
        log(f"starting ElasticMQ for the run on port {port}")
        started.start()
    try:
        path = bench_sqs_path(
            own, events=options.events, pullers=options.pullers, log_dir=log_dir, log=log
        )
    finally:
        if started is not None:
            started.stop()
    path["sqs_server"] = "ElasticMQ, " + (
        "started for the run (in memory)" if started else f"the stack's ({own.sqs_endpoint_url})"
    )
    return path


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
            acks.append(asyncio.run(post_all(webhook.sns_url, [body], 1)).seconds)

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
