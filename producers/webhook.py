"""The deliverability webhook (`flashsend webhook`): SNS events in, one-click unsubscribes.

| route            | what                                                                  |
|------------------|-----------------------------------------------------------------------|
| POST /sns        | SNS HTTP(S) endpoint: SES events → verified → Avro on mail.events     |
| POST /firehose   | Firehose HTTP endpoint: batches of SES events → Avro on mail.events   |
| GET  /u/{token}  | unsubscribe confirmation page (changes nothing)                       |
| POST /u/{token}  | RFC 8058 one-click unsubscribe (PostgreSQL first, event via outbox)   |
| GET  /health     | {"ok": true}                                                          |
| GET  /stats      | counters of both endpoints, publisher and outbox relay                |

Stateless but for caches, so run as many behind a load balancer as you like; the outbox relay
inside each instance takes a Postgres advisory lock, so exactly one of them publishes.
Starts even when Kafka or PostgreSQL is down: each route needs only its own dependency.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
from typing import Any

from psycopg_pool import AsyncConnectionPool

from flashsend import deliverability, health, metrics
from flashsend.errors import FlashsendError
from flashsend.settings import Settings
from producers.dlq import DeadLetterProducer
from producers.event_publisher import EventPublisher
from producers.firehose_endpoint import MAX_BODY_BYTES as FIREHOSE_MAX_BODY_BYTES
from producers.firehose_endpoint import FirehoseEndpoint
from producers.http_lean import LeanServer, Request, Response, Router
from producers.mail_topics import ensure_mail_topics
from producers.outbox_relay import OutboxRelay, RelayConfig
from producers.ses_events import SCHEMA
from producers.sns_endpoint import SnsEndpoint
from producers.sns_verify import CertificateSource, VerifierPolicy
from producers.unsubscribe_endpoint import UnsubscribeEndpoint
from producers.webhook_processes import PortTaken, supervise
from schemas import serde
from sinks import metrics_state
from sinks.feedback_store import UnsubscribeStore

log = logging.getLogger("flashsend.webhook")

OUTBOX_TABLE = "feedback_outbox"


class WebhookRuntime:
    """Everything one webhook process holds: pool, producer, endpoints, the relay thread."""

    def __init__(
        self,
        settings: Settings,
        *,
        policy: VerifierPolicy | None = None,
        certificates: CertificateSource | None = None,
        relay: bool = True,
        ensure_topics: bool = True,
    ) -> None:
        s = settings
        self.settings = s
        self._ensure_topics = ensure_topics
        keys = deliverability.token_keys(s)  # refuses the local key with real SES, up front
        self.pool = AsyncConnectionPool(
            s.pg_dsn, min_size=1, max_size=8, open=False, kwargs={"autocommit": True}
        )
        self.publisher = EventPublisher(
            s.kafka_bootstrap, s.topic_mail_events, timeout_s=s.webhook_publish_timeout_s
        )
        self.dlq = DeadLetterProducer(s.kafka_bootstrap, s.topic_dlq)
        self.sns = SnsEndpoint(
            policy=policy or deliverability.verifier_policy(s),
            certificates=certificates or deliverability.certificate_source(s),
            publisher=self.publisher,
            codec=serde.codec(s, SCHEMA),
            dlq=self.dlq,
        )
        self.firehose = FirehoseEndpoint(
            access_keys=deliverability.firehose_access_keys(s),
            publisher=self.publisher,
            codec=self.sns.codec,
            dlq=self.dlq,
        )
        self.unsubscribe = UnsubscribeEndpoint(
            keys, UnsubscribeStore(self.pool, topic=s.topic_mail_events)
        )
        self._relay_stop = threading.Event()
        self._relay: OutboxRelay | None = None
        self._relay_thread: threading.Thread | None = None
        if relay:
            self._relay = OutboxRelay(
                s.pg_dsn,
                RelayConfig(
                    table=OUTBOX_TABLE,
                    bootstrap=s.kafka_bootstrap,
                    registry_url=s.schema_registry_url,
                    registry_auto_register=bool(s.schema_auto_register),
                    schema_compatibility=s.schema_compatibility,
                    notify_channel=OUTBOX_TABLE,
                    batch=s.relay_batch,
                    poll_s=s.relay_poll_s,
                    publish_timeout_s=s.relay_publish_timeout_s,
                    max_failures=s.relay_max_failures,
                    backoff_cap_s=s.relay_backoff_cap_s,
                ),
            )

    async def start(self) -> None:
        await self.pool.open(wait=False)  # PostgreSQL may be down: only /u/ needs it
        if self._ensure_topics:  # in the background: Kafka may be down (only /sns needs it)
            threading.Thread(target=self._create_topics, name="ensure-topics", daemon=True).start()
        if self._relay is not None:
            self._relay_thread = threading.Thread(
                target=self._relay.run, args=(self._relay_stop,), name="feedback-relay", daemon=True
            )
            self._relay_thread.start()

    def _create_topics(self) -> None:
        try:
            ensure_mail_topics(self.settings, timeout=10.0)
        except FlashsendError as exc:
            log.warning("could not ensure topics (Kafka down?): %s", exc)

    async def stop(self) -> None:
        self._relay_stop.set()
        if self._relay_thread is not None:
            await asyncio.to_thread(self._relay_thread.join, 10)
        await asyncio.to_thread(self.publisher.close, 2.0)
        await self.pool.close()

    def stats(self) -> dict[str, Any]:
        relay = self._relay.stats if self._relay is not None else None
        return {
            "pid": os.getpid(),  # with --processes N, each process answers for itself
            "sns": dict(self.sns.stats),
            "firehose": dict(self.firehose.stats),
            "unsubscribe": dict(self.unsubscribe.stats),
            "published_records": self.publisher.published,
            "relay": None
            if relay is None
            else {
                "published": relay.published,
                "failures": relay.failures,
                "leader": relay.lock_held,
            },
        }


def _outcome(status: int) -> str:
    if status < 300:
        return "accepted"
    if status == 403:
        return "rejected"
    return "bad_request" if status < 500 else "error"


HEALTH_PATH = "/health"  # answers once the server listens (deploy/kubernetes probes it)
_JSON = "application/json; charset=utf-8"


def build_router(runtime: WebhookRuntime) -> Router:
    """The webhook's routes (module docstring) on the lean HTTP server."""
    sns, firehose = runtime.sns, runtime.firehose

    async def sns_route(request: Request) -> Response:
        status, text = await sns.handle(request.body, request.headers.get("x-amz-sns-message-type"))
        metrics.count_webhook(_outcome(status))
        return Response(status, text.encode())

    async def firehose_route(request: Request) -> Response:
        status, body = await firehose.handle(request.body, request.headers)
        metrics.count_webhook(_outcome(status))
        return Response(status, body, "application/json")

    async def health_route(_request: Request) -> Response:
        return Response(200, b'{"ok": true}', _JSON)

    async def stats_route(_request: Request) -> Response:
        return Response(200, json.dumps(runtime.stats()).encode(), _JSON)

    router = Router()
    router.add("POST", deliverability.SNS_PATH, sns_route)
    router.add("POST", deliverability.FIREHOSE_PATH, firehose_route)
    router.add("GET", HEALTH_PATH, health_route)
    router.add("GET", "/stats", stats_route)
    runtime.unsubscribe.register(router)
    return router


async def serve(
    runtime: WebhookRuntime,
    host: str,
    port: int,
    stop: asyncio.Event,
    *,
    reuse_port: bool = False,
) -> None:
    # The largest body any route takes; /sns refuses more than SNS's own limit by itself.
    server = LeanServer(build_router(runtime), max_body=FIREHOSE_MAX_BODY_BYTES)
    await runtime.start()
    try:
        try:
            await server.start(host, port, reuse_port=reuse_port)
        except OSError as exc:
            raise PortTaken(f"{host}:{port} is in use or cannot be bound ({exc})") from exc
        log.info("webhook ready on http://%s:%s", host, port)
        print(f"webhook listening on http://{host}:{port}", flush=True)
        await stop.wait()
    finally:
        await server.stop(grace_s=2.0)
        await runtime.stop()  # also after a failed bind: closes the pool, stops the relay


async def _stop_when_orphaned(stop: asyncio.Event) -> None:
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(1.0)
    stop.set()


def run_webhook(
    settings: Settings,
    host: str,
    port: int,
    loglevel: str = "info",
    *,
    processes: int = 1,
    reuse_port: bool = False,
    relay: bool = True,
) -> int:
    """`flashsend webhook`: serve until SIGTERM/SIGINT; `processes` > 1 supervises that many
    single-process webhooks sharing the port (`producers.webhook_processes`)."""
    from flashsend.logs import configure

    configure(settings.log_format, loglevel)
    deliverability.check_separation(settings)
    deliverability.token_keys(settings)  # a refused key fails here, not in every child
    if processes > 1:
        return supervise(settings, host, port, loglevel, processes)
    metrics_state.start(settings, "webhook")  # /metrics when FLASHSEND_METRICS_PORT is set

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        health.start_heartbeat()  # /healthz on the metrics port
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        watchdog = None
        if settings.worker_exit_with_parent:  # started by a test, bench or e2e run
            watchdog = asyncio.create_task(_stop_when_orphaned(stop))
        await serve(WebhookRuntime(settings, relay=relay), host, port, stop, reuse_port=reuse_port)
        if watchdog is not None:
            watchdog.cancel()

    asyncio.run(main())
    return 0
