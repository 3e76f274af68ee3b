"""Prometheus metrics of workers, relay and webhook: one registry per process, `/metrics`.

Two kinds:
- counters/histograms updated inline, cheaply (a dict lookup and an add per SES call, never
  per record: the campaign sender counts a call's results in one go) — `count_results`,
  `observe_ses_call`, `add_throttle_wait`, `count_dead_letters`, and for the webhook /
  feedback side `count_webhook`, `count_suppressions`, `count_feedback`;
- gauges computed at scrape time from PostgreSQL and the broker (`StateCollector`): consumer
  lag per partition (log end − the offset stored in PostgreSQL, which is what our workers
  resume from), outbox backlog and age of its oldest row, dead-letter topic size, complaint
  and bounce rates per campaign (`campaign_feedback`). Cached for a few seconds so
  a scrape costs a handful of small queries, whatever the scrape rate.

`serve(settings, collector)` starts the HTTP endpoint when `metrics_port` is set (0 = off,
-1 = any free port, logged). Alert rules and thresholds: docs/operations.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger("flashsend.metrics")

REGISTRY = CollectorRegistry(auto_describe=True)

RECIPIENTS = Counter(
    "flashsend_recipients",
    "campaign recipients by final outcome of a send attempt",
    ["campaign", "status"],
    registry=REGISTRY,
)  # sent | failed | unknown | skipped | pending …
SES_CALL_SECONDS = Histogram(
    "flashsend_ses_call_seconds",
    "duration of one SES call (SendBulkEmail / SendEmail)",
    ["api"],
    registry=REGISTRY,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
SMS_SEGMENTS = Counter(
    "flashsend_sms_segments",
    "segments of the SMS accepted by the provider (what carriers bill)",
    ["campaign"],
    registry=REGISTRY,
)
SES_CALLS = Counter(
    "flashsend_ses_calls", "SES calls by result", ["api", "result"], registry=REGISTRY
)
THROTTLE_WAIT = Counter(
    "flashsend_throttle_wait_seconds",
    "time spent waiting for the rate limiter",
    ["path"],
    registry=REGISTRY,
)
DEAD_LETTERS = Counter(
    "flashsend_dead_letters",
    "records sent to the dead-letter topic",
    ["topic", "reason"],
    registry=REGISTRY,
)
MAIL = Counter("flashsend_mail", "transactional mail transitions", ["status"], registry=REGISTRY)
MAIL_STALE = Counter(
    "flashsend_mail_stale_events",
    "order events older than mail_event_max_age_s: recorded, no mail created",
    ["event_type"],
    registry=REGISTRY,
)
SUPPRESSIONS = Counter(
    "flashsend_suppression_inserts",
    "addresses added to email_suppressions",
    ["reason"],
    registry=REGISTRY,
)
FEEDBACK = Counter(
    "flashsend_feedback_events",
    "SES feedback events applied",
    ["campaign", "type"],
    registry=REGISTRY,
)
WEBHOOK = Counter(
    "flashsend_webhook_requests", "SNS webhook requests by outcome", ["outcome"], registry=REGISTRY
)
INGESTED = Counter(
    "flashsend_events_ingested",
    "records consumed and handed to the handler, counted per batch",
    ["topic"],
    registry=REGISTRY,
)
PUBLISHED = Counter(
    "flashsend_outbox_published", "outbox rows published (acked)", ["table"], registry=REGISTRY
)


class HasStatus(Protocol):
    @property
    def status(self) -> str: ...


def count_sms_segments(campaign_id: int, segments: int) -> None:
    if segments:
        SMS_SEGMENTS.labels(str(campaign_id)).inc(segments)


def count_results(campaign_id: int, results: Sequence[HasStatus]) -> None:
    """One call per SES call / release: aggregates first, then one add per status."""
    if not results:
        return
    by_status: dict[str, int] = {}
    for r in results:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    cid = str(campaign_id)
    for status, n in by_status.items():
        RECIPIENTS.labels(cid, status).inc(n)


def count_skipped(campaign_ids: Iterable[int], skipped: int) -> None:
    """Skipped at claim (opted out / suppressed after the snapshot). The claim result does not
    say which campaign each skip belongs to: a round of one campaign (the usual case) gets it,
    a mixed round is labelled `mixed`."""
    if skipped:
        ids = set(campaign_ids)
        RECIPIENTS.labels(str(next(iter(ids))) if len(ids) == 1 else "mixed", "skipped").inc(
            skipped
        )


def observe_ses_call(api: str, seconds: float, result: str) -> None:
    SES_CALL_SECONDS.labels(api).observe(seconds)
    SES_CALLS.labels(api, result).inc()


def add_throttle_wait(path: str, seconds: float) -> None:
    if seconds > 0:
        THROTTLE_WAIT.labels(path).inc(seconds)


def count_dead_letters(topic: str, reasons: Iterable[str]) -> None:
    for reason in reasons:
        DEAD_LETTERS.labels(topic, reason).inc()


def count_mail(status: str, n: int = 1) -> None:
    MAIL.labels(status).inc(n)


def count_stale_event(event_type: str) -> None:
    MAIL_STALE.labels(event_type).inc()


# ---- for the webhook and the feedback consumer ------------------------------------


_webhook_children: dict[str, Any] = {}  # labels() costs ~4x inc(); it runs for every POST


def count_webhook(outcome: str) -> None:
    """outcome: accepted | rejected_signature | rejected_topic | confirmed | error …"""
    child = _webhook_children.get(outcome)
    if child is None:
        child = _webhook_children[outcome] = WEBHOOK.labels(outcome)
    child.inc()


def count_suppressions(reason: str, n: int = 1) -> None:
    if n:
        SUPPRESSIONS.labels(reason).inc(n)


def count_feedback(campaign: str, event_type: str, n: int = 1) -> None:
    """event_type: the counter the event feeds (delivered, bounced, complained, …; `other`
    when none); campaign: '' for untagged events."""
    FEEDBACK.labels(campaign, event_type).inc(n)


def count_feedback_effects(effects: Iterable[tuple[int | None, str | None]]) -> None:
    """One batch of (campaign, counter) pairs: aggregated first, one add per pair."""
    by_kind: dict[tuple[int | None, str | None], int] = {}
    for kind in effects:
        by_kind[kind] = by_kind.get(kind, 0) + 1
    for (campaign, counter), n in by_kind.items():
        count_feedback("" if campaign is None else str(campaign), counter or "other", n)


def count_ingested(topic: str, n: int) -> None:
    """Per consumed batch (never per record): the hot campaign path pays one add a batch."""
    INGESTED.labels(topic).inc(n)


def count_published(table: str, n: int) -> None:
    if n:
        PUBLISHED.labels(table).inc(n)


def declare(
    *,
    ses_calls: Iterable[tuple[str, str]] = (),
    throttle_paths: Iterable[str] = (),
    mail_statuses: Iterable[str] = (),
    suppression_reasons: Iterable[str] = (),
    webhook_outcomes: Iterable[str] = (),
    ingested_topics: Iterable[str] = (),
    published_tables: Iterable[str] = (),
) -> None:
    """Create a process's series at 0 when it starts. A series that first appears at 1 has no
    earlier sample, so `increase()` in an alert misses its first event; a zero series also
    shows on the dashboard that the process is alive and exports it."""
    for api, result in ses_calls:
        SES_CALLS.labels(api, result)
    for path in throttle_paths:
        THROTTLE_WAIT.labels(path)
    for status in mail_statuses:
        MAIL.labels(status)
    for reason in suppression_reasons:
        SUPPRESSIONS.labels(reason)
    for outcome in webhook_outcomes:
        WEBHOOK.labels(outcome)
    for topic in ingested_topics:
        INGESTED.labels(topic)
    for table in published_tables:
        PUBLISHED.labels(table)


# ---- scrape-time state --------------------------------------------------------------------


@dataclass(eq=False)  # registered by identity
class StateCollector(Collector):
    """Gauges read from PostgreSQL and the broker at scrape time (cached `ttl_s`)."""

    read: Callable[[], list[GaugeMetricFamily]]
    ttl_s: float = 5.0
    _cached: list[GaugeMetricFamily] = field(default_factory=list)
    _at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def collect(self) -> Iterable[GaugeMetricFamily]:
        with self._lock:
            if time.monotonic() - self._at >= self.ttl_s:
                try:
                    self._cached = self.read()
                except Exception as exc:  # a scrape must never take the process down
                    log.warning("metrics state read failed: %s", exc)
                    self._cached = []
                self._at = time.monotonic()
            return list(self._cached)

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return []


_collectors: dict[str, Collector] = {}
_collectors_lock = threading.Lock()


def install(name: str, collector: Collector) -> None:
    """Register a scrape-time collector under a name (replacing an earlier one)."""
    with _collectors_lock:
        old = _collectors.pop(name, None)
        if old is not None:
            REGISTRY.unregister(old)
        REGISTRY.register(collector)
        _collectors[name] = collector


_servers: dict[int, Any] = {}


def serve(port: int, host: str = "127.0.0.1") -> int | None:
    """Start `/metrics` (0 = off, -1 = any free port); returns the port or None."""
    if port == 0:
        return None
    if port < 0:
        from infra.process import free_port

        port = free_port()
    if port not in _servers:
        _servers[port] = _start_server(port, host)
        log.warning("metrics on http://%s:%d/metrics (probes: /healthz, /readyz)", host, port)
    return port


def _start_server(port: int, host: str) -> Any:
    """/metrics, and the scheduler's probes (flashsend.health) on the same port."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import make_wsgi_app
    from prometheus_client.exposition import ThreadingWSGIServer

    from flashsend import health

    metrics_app = make_wsgi_app(REGISTRY)
    probes = {health.LIVENESS_PATH: health.PROBE.alive, health.READINESS_PATH: health.PROBE.ready}

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        probe = probes.get(environ.get("PATH_INFO", ""))
        if probe is None:
            return metrics_app(environ, start_response)  # type: ignore[no-any-return]
        ok, why = probe(time.monotonic())
        body = (why + "\n").encode()
        status = "200 OK" if ok else "503 Service Unavailable"
        start_response(status, [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = make_server(host, port, app, ThreadingWSGIServer, handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return server
