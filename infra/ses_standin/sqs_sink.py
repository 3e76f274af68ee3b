"""Event publishing into SQS: the stand-in's SNS topic with an SQS subscription (raw delivery).

In AWS: configuration set → event destination → SNS topic → SQS subscription with
RawMessageDelivery → each message body is the SES event JSON itself. Here the same bodies
reach a real SQS server (ElasticMQ locally) through boto3 SendMessageBatch, beside the signed
HTTP POSTs of `emission.py` (both may run at once; each address gets the same outcome on
both, since outcomes are hashed from the address with the same rates).

The hook only plans (outcome per recipient, the injected addresses remembered for tests) and
buffers, as `emission.py` does; a child process (`python -m infra.ses_standin.sqs_sink`) builds
the events and sends them, so boto3's CPU stays off the SES request handlers. A batch SQS
refuses (server down, throttled, some entries failed) is retried with backoff for as long as
the child runs (SNS retries an SQS endpoint for 23 days); stdin EOF stops the child, dropping
what is still undelivered (counted).

| route                                   | what                                                |
|-----------------------------------------|-----------------------------------------------------|
| POST /_admin/sqs-subscriptions          | {queue_url, topic_arn, configuration_sets?,         |
|                                         |  event_types?}: confirmed at once (same account)    |
| GET  /_admin/sqs-subscriptions          | subscriptions with delivery statistics              |
| DELETE /_admin/sqs-subscriptions/{id}   | unsubscribe                                         |
| GET  /_admin/sqs-feedback?campaign=C    | addresses given each outcome, per campaign          |
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import random
import sys
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from infra.ses_standin.errors import BadRequest
from infra.ses_standin.event_records import build_events
from infra.ses_standin.feedback_plan import (
    DELIVERED,
    FeedbackRates,
    message_rejected,
    recipient_outcome,
)
from infra.ses_standin.journal import Record
from infra.ses_standin.recipients import parse_address
from infra.ses_standin.state_file import save_json
from infra.ses_standin.subscriptions import EVENT_TYPES as SNS_EVENT_TYPES

log = logging.getLogger("infra.ses_standin.sqs_sink")

FLUSH_EVERY_S = 0.02
MAX_BUFFER = 200_000  # messages waiting for the child; beyond, dropped (and counted)
MAX_PENDING = 500_000  # events in the child not yet accepted by SQS; beyond, dropped
MAX_LISTED = 200_000  # addresses remembered per campaign and outcome
SEND_THREADS = 4
# This path plans no engagement (Open/Click come only by the SNS path, emission.py).
EVENT_TYPES = tuple(t for t in SNS_EVENT_TYPES if t not in ("Open", "Click"))
STATS_LINE_LIMIT = 16 * 1024 * 1024
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

RatesFor = Callable[[str | None], FeedbackRates]


@dataclass(frozen=True)
class SqsSubscription:
    id: str
    queue_url: str
    topic_arn: str
    configuration_sets: tuple[str, ...] | None = None
    event_types: tuple[str, ...] | None = None
    created_at: float = 0.0

    def matches(self, configuration_set: str | None) -> bool:
        return self.configuration_sets is None or configuration_set in self.configuration_sets

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(protocol="sqs", raw_message_delivery=True, status="confirmed")
        return data


def parse_subscription(body: Mapping[str, Any]) -> dict[str, Any]:
    """Validate `POST /_admin/sqs-subscriptions` (pure); ValueError names the first problem."""
    url = body.get("queue_url")
    if not isinstance(url, str) or urlsplit(url).scheme not in ("http", "https"):
        raise ValueError("queue_url must be the queue's http(s) URL")
    topic = body.get("topic_arn")
    if not isinstance(topic, str) or not topic.startswith("arn:aws:sns:") or " " in topic:
        raise ValueError("topic_arn must be an SNS topic ARN (arn:aws:sns:…)")
    out: dict[str, Any] = {"queue_url": url, "topic_arn": topic}
    for key in ("configuration_sets", "event_types"):
        value = body.get(key)
        if value is None:
            out[key] = None
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise ValueError(f"{key} must be a list of names or null")
        if key == "event_types" and not set(value) <= set(EVENT_TYPES):
            raise ValueError(f"event_types must be among {list(EVENT_TYPES)}")
        out[key] = tuple(value)
    if body.get("raw_message_delivery", True) is not True:
        raise ValueError("only raw message delivery is emulated (the body is the SES event)")
    return out


class SqsSubscriptionStore:
    """SQS subscriptions by id, saved to a JSON file on every change."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._subs: dict[str, SqsSubscription] = {}
        if path.exists():
            for item in json.loads(path.read_text() or "[]"):
                for key in ("configuration_sets", "event_types"):
                    if item.get(key) is not None:
                        item[key] = tuple(item[key])
                sub = SqsSubscription(**item)
                self._subs[sub.id] = sub

    def all(self) -> list[SqsSubscription]:
        return list(self._subs.values())

    def subscribe(self, request: Mapping[str, Any], now: float) -> SqsSubscription:
        """Subscribing the same queue to the same topic again updates its filters."""
        for sub in self._subs.values():
            if sub.queue_url == request["queue_url"] and sub.topic_arn == request["topic_arn"]:
                self._subs[sub.id] = updated = SqsSubscription(
                    id=sub.id, created_at=sub.created_at, **request
                )
                self._save()
                return updated
        sub = SqsSubscription(id=str(uuid.uuid4()), created_at=now, **request)
        self._subs[sub.id] = sub
        self._save()
        return sub

    def delete(self, sub_id: str) -> bool:
        if self._subs.pop(sub_id, None) is None:
            return False
        self._save()
        return True

    def _save(self) -> None:
        save_json(self.path, [asdict(s) for s in self._subs.values()])


def rates_of(emission: Any) -> RatesFor:
    """The feedback rates the SNS emission uses (`/_admin/feedback/rates`), per configuration
    set, so an address bounces on both paths alike."""

    def rates_for(configuration_set: str | None) -> FeedbackRates:
        rates: dict[str, FeedbackRates] = emission.rates
        return rates.get(configuration_set or "", rates["*"])

    return rates_for


def _key(address: str) -> str:
    try:
        return parse_address(address, "destination")[1]
    except BadRequest:
        return address.lower()


class SqsSink:
    """The stand-in side: the send-path hook, the child process, the admin routes."""

    def __init__(self, state_dir: Path, rates: RatesFor, *, region: str = "us-east-1") -> None:
        self.state_dir = state_dir
        self.rates = rates
        self.region = region
        self.subscriptions = SqsSubscriptionStore(state_dir / "sqs-subscriptions.json")
        self.injected: dict[str, dict[str, list[str]]] = {}
        self.counts: dict[str, dict[str, int]] = {}
        self.child_stats: dict[str, Any] = {}
        self.dropped = 0
        self.planned = 0
        self.handed = 0  # messages written to the child
        self._active = self.subscriptions.all()
        self._buffer: list[dict[str, Any]] = []
        self._wake = asyncio.Event()
        self._proc: asyncio.subprocess.Process | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @classmethod
    def beside(cls, emission: Any, state_dir: Path) -> SqsSink:
        return cls(state_dir, rates_of(emission), region=emission.region)

    # ---- the send-path hook ---------------------------------------------------------------

    def on_accepted(self, record: Record) -> None:
        if not self._active:
            return
        configuration_set = record.get("configuration_set")
        subs = [s.id for s in self._active if s.matches(configuration_set)]
        if not subs:
            return
        rates = self.rates(configuration_set)
        campaign = str((record.get("tags") or {}).get("campaign", ""))
        plan = []
        for given in (*record["destination"], *record.get("cc", ()), *record.get("bcc", ())):
            key = _key(given)
            outcome = recipient_outcome(key, rates)
            plan.append((given, outcome))
            self._remember(campaign, outcome, key)
        if len(self._buffer) >= MAX_BUFFER:
            self.dropped += 1
            return
        rejected = message_rejected(record["message_id"], rates)
        if rejected:
            self._remember(campaign, "rejected", record["message_id"])
        self._buffer.append({"record": record, "plan": plan, "rejected": rejected, "subs": subs})
        self.planned += 1
        if len(self._buffer) >= 500:
            self._wake.set()

    def _remember(self, campaign: str, outcome: str, value: str) -> None:
        counts = self.counts.setdefault(campaign, {})
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome == DELIVERED:
            return
        listed = self.injected.setdefault(campaign, {}).setdefault(outcome, [])
        if len(listed) < MAX_LISTED:
            listed.append(value)

    # ---- the child process ----------------------------------------------------------------

    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._flusher(), name="sqs-sink-flush"))
        if self._active:
            await self._ensure_child()

    async def _ensure_child(self) -> None:
        if self._proc is not None and self._proc.returncode is None:
            return
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "infra.ses_standin.sqs_sink",
            "--region",
            self.region,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=STATS_LINE_LIMIT,
        )
        self._tasks.append(asyncio.create_task(self._read_stats(self._proc), name="sqs-stats"))
        await self._send_subs()
        log.info("sqs_sink_started pid=%s", self._proc.pid)

    async def _send(self, op: Mapping[str, Any]) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.returncode is not None:
            return
        proc.stdin.write(_dumps(op).encode() + b"\n")
        await proc.stdin.drain()

    async def _send_subs(self) -> None:
        self._active = self.subscriptions.all()
        await self._send({"op": "subs", "subs": [s.to_dict() for s in self._active]})

    async def _flusher(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), FLUSH_EVERY_S)
            self._wake.clear()
            if not self._buffer:
                continue
            items, self._buffer = self._buffer, []
            try:
                await self._ensure_child()
                await self._send({"op": "msgs", "items": items})
                self.handed += len(items)
            except (OSError, ConnectionError) as exc:  # child died: restarted next time
                self.dropped += len(items)
                log.warning("sqs_sink_write_failed %s", exc)

    async def _read_stats(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while True:
            try:
                line = await proc.stdout.readline()
            except ValueError:
                continue
            if not line:
                break
            with contextlib.suppress(ValueError):
                self.child_stats = json.loads(line)
        log.warning("sqs_sink_exited code=%s", await proc.wait())

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        proc = self._proc
        if proc is not None and proc.returncode is None:
            if proc.stdin is not None:
                proc.stdin.close()
            try:
                await asyncio.wait_for(proc.wait(), 3.0)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    # ---- HTTP -----------------------------------------------------------------------------

    def register(self, app: web.Application) -> None:
        router = app.router
        router.add_post("/_admin/sqs-subscriptions", self.subscribe)
        router.add_get("/_admin/sqs-subscriptions", self.list_subscriptions)
        router.add_delete("/_admin/sqs-subscriptions/{id}", self.unsubscribe)
        router.add_get("/_admin/sqs-feedback", self.feedback)
        app.on_cleanup.append(lambda _app: self.stop())

    async def subscribe(self, request: web.Request) -> web.Response:
        try:
            parsed = parse_subscription(json.loads(await request.read() or b"{}"))
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        sub = self.subscriptions.subscribe(parsed, time.time())
        await self._ensure_child()
        await self._send_subs()
        return web.json_response(self._describe(sub))

    def _describe(self, sub: SqsSubscription) -> dict[str, Any]:
        return {**sub.to_dict(), "delivery": self.child_stats.get("subs", {}).get(sub.id, {})}

    async def list_subscriptions(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "subscriptions": [self._describe(s) for s in self.subscriptions.all()],
                "buffered": len(self._buffer),
                "pending": self.pending,
                "events": self.child_stats.get("events", 0),
                "overflow": self.child_stats.get("overflow", 0),
                "dropped": self.dropped,
                "planned_messages": self.planned,
            }
        )

    @property
    def pending(self) -> int:
        """Events not yet in SQS, counting messages still on their way to the child (each one
        event at least, as every message publishes a Send or more)."""
        in_pipe = max(0, self.handed - int(self.child_stats.get("messages", 0)))
        return len(self._buffer) + in_pipe + int(self.child_stats.get("pending", 0))

    async def unsubscribe(self, request: web.Request) -> web.Response:
        found = self.subscriptions.delete(request.match_info["id"])
        await self._send_subs()
        return web.json_response({"deleted": found}, status=200 if found else 404)

    async def feedback(self, request: web.Request) -> web.Response:
        campaign = request.query.get("campaign", "")
        return web.json_response(
            {
                "campaign": campaign,
                "counts": self.counts.get(campaign, {}),
                "addresses": self.injected.get(campaign, {}),
            }
        )


# ---- the child: build events, SendMessageBatch ---------------------------------------------


@dataclass
class QueueStats:
    delivered: int = 0
    retried: int = 0
    last_error: str = ""


@dataclass
class Batch:
    sub_id: str
    queue_url: str
    bodies: list[str]
    attempts: int = 0


def batches_for(
    subs: Mapping[str, Mapping[str, Any]],
    item: Mapping[str, Any],
    *,
    now: datetime,
    region: str,
) -> dict[str, list[str]]:
    """Raw SQS bodies per subscription for one accepted message (pure)."""
    targets = [subs[s] for s in item["subs"] if s in subs]
    out: dict[str, list[str]] = defaultdict(list)
    if not targets:
        return out
    plan = [(str(a), str(o)) for a, o in item["plan"]]
    # Only the types some target subscribes to are built (None: a target takes every type).
    kinds = [sub.get("event_types") for sub in targets]
    wanted = None if any(k is None for k in kinds) else {t for k in kinds for t in k or ()}
    for event_type, event in build_events(
        item["record"],
        plan,
        rejected=bool(item["rejected"]),
        now=now,
        region=region,
        wanted=wanted,
    ):
        body: str | None = None
        for sub in targets:
            types = sub.get("event_types")
            if types is not None and event_type not in types:
                continue
            body = body or _dumps(event)
            out[sub["id"]].append(body)
    return out


@dataclass
class Sender:
    region: str
    threads: int = SEND_THREADS
    subs: dict[str, dict[str, Any]] = field(default_factory=dict)
    stats: dict[str, QueueStats] = field(default_factory=dict)
    events: int = 0
    messages: int = 0
    overflow: int = 0
    _waiting: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    _ready: deque[Batch] = field(default_factory=deque)
    _in_flight: int = 0
    _retrying: int = 0
    _has_work: asyncio.Event = field(default_factory=asyncio.Event)
    _clients: dict[str, Any] = field(default_factory=dict)

    @property
    def pending(self) -> int:
        queued = sum(len(b.bodies) for b in self._ready)
        waiting = sum(len(v) for v in self._waiting.values())
        return waiting + queued + self._in_flight + self._retrying

    def handle(self, op: Mapping[str, Any]) -> None:
        if op.get("op") == "subs":
            self.subs = {s["id"]: s for s in op["subs"]}
        elif op.get("op") == "msgs":
            now = datetime.now(UTC)
            self.messages += len(op["items"])
            for item in op["items"]:
                for sub_id, bodies in batches_for(
                    self.subs, item, now=now, region=self.region
                ).items():
                    if self.pending + len(bodies) > MAX_PENDING:
                        self.overflow += len(bodies)
                        continue
                    self.events += len(bodies)
                    self._waiting[sub_id].extend(bodies)
            self._cut()

    def _cut(self) -> None:
        """What one flush brought goes out in batches of 10 (SendMessageBatch's maximum)."""
        for sub_id, bodies in self._waiting.items():
            sub = self.subs.get(sub_id)
            if sub is None:
                continue
            for start in range(0, len(bodies), 10):
                self._ready.append(Batch(sub_id, sub["queue_url"], bodies[start : start + 10]))
        self._waiting.clear()
        if self._ready:
            self._has_work.set()

    def _client(self, queue_url: str) -> Any:
        parts = urlsplit(queue_url)
        endpoint = f"{parts.scheme}://{parts.netloc}"
        client = self._clients.get(endpoint)
        if client is None:
            import boto3
            from botocore.config import Config

            client = self._clients[endpoint] = boto3.session.Session().client(
                "sqs",
                endpoint_url=endpoint,
                region_name=self.region,
                aws_access_key_id="flashsend-local",
                aws_secret_access_key="flashsend-local",
                config=Config(
                    retries={"total_max_attempts": 1},
                    parameter_validation=False,
                    max_pool_connections=self.threads * 2,
                    connect_timeout=2,
                    read_timeout=10,
                ),
            )
        return client

    @staticmethod
    def _send_batch(client: Any, batch: Batch) -> list[str]:
        """SendMessageBatch; return the bodies SQS did not take."""
        entries = [{"Id": str(i), "MessageBody": b} for i, b in enumerate(batch.bodies)]
        answer = client.send_message_batch(QueueUrl=batch.queue_url, Entries=entries)
        return [batch.bodies[int(f["Id"])] for f in answer.get("Failed") or ()]

    async def _worker(self, pool: ThreadPoolExecutor) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._has_work.wait()
            if not self._ready:
                self._has_work.clear()
                continue
            batch = self._ready.popleft()
            if batch.sub_id not in self.subs:
                continue  # unsubscribed meanwhile
            stats = self.stats.setdefault(batch.sub_id, QueueStats())
            batch.attempts += 1
            self._in_flight += len(batch.bodies)
            try:
                client = self._client(batch.queue_url)  # made here: sessions are not thread-safe
                failed = await loop.run_in_executor(pool, self._send_batch, client, batch)
            except Exception as exc:  # connection refused, throttled, 5xx: all retried
                failed, stats.last_error = batch.bodies, f"{type(exc).__name__}: {exc}"[:200]
            finally:
                self._in_flight -= len(batch.bodies)
            stats.delivered += len(batch.bodies) - len(failed)
            if failed:
                stats.retried += len(failed)
                retry = Batch(batch.sub_id, batch.queue_url, failed, batch.attempts)
                delay = random.uniform(0, min(5.0, 0.05 * 2 ** min(batch.attempts, 10)))
                self._retrying += len(failed)
                loop.call_later(delay, self._requeue, retry)

    def _requeue(self, batch: Batch) -> None:
        self._retrying -= len(batch.bodies)
        self._ready.append(batch)
        self._has_work.set()

    def stats_line(self) -> str:
        return _dumps(
            {
                "op": "stats",
                "pending": self.pending,
                "events": self.events,
                "messages": self.messages,
                "overflow": self.overflow,
                "subs": {k: asdict(v) for k, v in self.stats.items()},
            }
        )

    async def run(self, reader: asyncio.StreamReader) -> None:
        pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="sqs-send")
        tasks = [asyncio.create_task(self._worker(pool)) for _ in range(self.threads)]
        tasks.append(asyncio.create_task(self._report()))
        try:
            while line := await reader.readline():
                self.handle(json.loads(line))
            deadline = time.monotonic() + 2.0  # stdin closed: a short drain, then exit
            while self.pending and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            pool.shutdown(wait=False, cancel_futures=True)
            sys.stdout.write(self.stats_line() + "\n")  # `pending` now: dropped at stop
            sys.stdout.flush()

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            sys.stdout.write(self.stats_line() + "\n")
            sys.stdout.flush()


async def _main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=256 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    await Sender(region=args.region, threads=args.threads).run(reader)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.ses_standin.sqs_sink")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--threads", type=int, default=SEND_THREADS)
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
