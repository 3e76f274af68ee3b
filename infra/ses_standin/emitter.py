"""The stand-in's SNS deliverer, run as a child process: build, sign and POST notifications.

    python -m infra.ses_standin.emitter --key KEY.pem --cert-url URL --base-url URL

Why a child process: every event costs an RSA signature and an HTTP request; done in the
stand-in's own process that work would hold the GIL away from the SES request handlers, i.e.
slow the send path. Here the send path pays one pipe write per batch.

What it costs is taken from the product it measures (they share the machine), so it does as
little as it can: only the event types some subscription wants are built (an event
destination's matching types), each event's JSON once for all its subscriptions, signatures
in two threads (the RSA work releases the GIL) with the stand-in's own small key, and POSTs
with a minimal HTTP/1.1 client (`http_post.py`).

Stopping: stdin EOF (the stand-in stopped) or the stand-in gone (orphaned) ends the process at
once. What was not delivered is dropped and counted — or, with `--backlog-file`, written there
for the next start to resume (the stand-in's `--resume-events`).

Protocol (JSON lines; `emission.py` is the other end):
- stdin  `{"op": "subs", "subs": [...]}`  the confirmed subscriptions (replaces the last list)
- stdin  `{"op": "confirm", "sub": {...}, "subscribe_url": "…"}`  send a SubscriptionConfirmation
- stdin  `{"op": "msgs", "items": [{"record", "plan", "rejected", "subs"}, …]}`  accepted mail
- stdin  `{"op": "notes", "items": [{"subs", "body"}, …]}`  ready-made messages (SMS events)
- stdin  `{"op": "resume", "path": "…"}`  queue a backlog file written at a previous stop
- stdin  `{"op": "firehose", "streams": [...], "routes": {id: {"stream", "event_types"}}}`
  the delivery streams and the configuration sets' Firehose event destinations (a message's
  `routes` name them); delivered by `firehose_delivery.py`, dropped at stop (never resumed)
- stdout `{"op": "stats", …}` twice a second.

Delivery follows SNS's HTTP/S rules: a 2xx answer is delivered, any other 4xx is given up at
once (the endpoint refused the message; retrying cannot help), a 5xx, timeout or connection
error is retried with exponential backoff and jitter until the retry window (SNS: at most an
hour) has passed, then dropped and counted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import sys
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flashsend import gc_pauses
from infra.ses_standin.event_records import build_events
from infra.ses_standin.firehose_delivery import FirehoseDelivery
from infra.ses_standin.http_post import HttpPoster
from producers.sns_sign import build_notification, build_subscription_confirmation, sign_message

log = logging.getLogger("infra.ses_standin.emitter")

SIGN_BATCH = 64
SIGN_THREADS = 2
# POSTs in flight. SNS opens as many connections as an endpoint's throughput needs; a webhook
# answers only after its broker's ack (tens of ms under load), so 32 capped delivery at
# ~32 / latency, far below what the endpoint could take.
CONCURRENCY = 256
HTTP_TIMEOUT_S = 15.0  # SNS's HTTP/S request timeout
ORPHAN_CHECK_S = 0.5
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

# (subscription, unsigned envelope, x-amz-sns-message-type)
Unsigned = tuple[dict[str, Any], dict[str, str], str]


@dataclass(eq=False)
class Delivery:
    sub_id: str
    endpoint: str
    kind: str  # x-amz-sns-message-type
    message_id: str
    topic_arn: str
    sub_arn: str | None
    body: bytes
    first_at: float
    attempts: int = 0

    def headers(self) -> list[tuple[str, str]]:
        headers = [
            ("x-amz-sns-message-type", self.kind),
            ("x-amz-sns-message-id", self.message_id),
            ("x-amz-sns-topic-arn", self.topic_arn),
            ("Content-Type", "text/plain; charset=UTF-8"),
            ("User-Agent", "Amazon Simple Notification Service Agent"),
        ]
        if self.sub_arn:
            headers.append(("x-amz-sns-subscription-arn", self.sub_arn))
        return headers


@dataclass
class SubStats:
    delivered: int = 0
    retried: int = 0
    refused: int = 0  # 4xx: given up at once
    dropped: int = 0  # retry window exhausted
    last_status: int | None = None
    last_error: str = ""


@dataclass
class Emitter:
    key_pem: bytes
    cert_url: str
    base_url: str
    region: str = "us-east-1"
    concurrency: int = CONCURRENCY
    retry_window_s: float = 300.0
    max_pending: int = 500_000
    backlog_file: Path | None = None  # where to keep what is undelivered at stop
    subs: dict[str, dict[str, Any]] = field(default_factory=dict)
    stats: dict[str, SubStats] = field(default_factory=dict)
    events: int = 0
    overflow: int = 0
    routes: dict[str, dict[str, Any]] = field(default_factory=dict)  # Firehose destinations
    firehose: FirehoseDelivery = field(init=False)
    _to_sign: deque[Unsigned] = field(default_factory=deque)
    _signing: list[list[Unsigned]] = field(default_factory=list)  # batches in the threads
    _has_work: asyncio.Event = field(default_factory=asyncio.Event)
    _queue: asyncio.Queue[Delivery] = field(default_factory=asyncio.Queue)
    _posting: set[Delivery] = field(default_factory=set)
    _retrying: dict[Delivery, asyncio.TimerHandle] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.firehose = FirehoseDelivery(self.max_pending)

    @property
    def pending(self) -> int:
        return (
            self.firehose.pending
            + len(self._to_sign)
            + sum(len(b) for b in self._signing)
            + self._queue.qsize()
            + len(self._posting)
            + len(self._retrying)
        )

    # ---- input ----------------------------------------------------------------------------

    def handle(self, op: dict[str, Any]) -> None:
        kind = op.get("op")
        if kind == "subs":
            self.subs = {s["id"]: s for s in op["subs"]}
        elif kind == "confirm":
            sub = op["sub"]
            fields = build_subscription_confirmation(
                sub["topic_arn"], op["subscribe_url"], sub["token"], self.cert_url, _now()
            )
            self._enqueue(sub, fields, "SubscriptionConfirmation")
        elif kind == "msgs":
            for item in op["items"]:
                self._plan_message(item)
        elif kind == "notes":
            for item in op["items"]:
                self._publish(item["subs"], item["body"])
        elif kind == "resume":
            self.resume(Path(op["path"]))
        elif kind == "firehose":
            self.firehose.configure(op["streams"])
            self.routes = op["routes"]

    def _plan_message(self, item: dict[str, Any]) -> None:
        targets = [self.subs[s] for s in item["subs"] if s in self.subs]
        routes = [self.routes[r] for r in item.get("routes", ()) if r in self.routes]
        if not targets and not routes:
            return
        wanted: set[str] | None = set()
        for sub in [*targets, *routes]:
            types = sub.get("event_types")
            if types is None:
                wanted = None
                break
            assert wanted is not None
            wanted.update(types)
        now = _now()
        plan = [(str(a), str(o)) for a, o in item["plan"]]
        for event_type, event in build_events(
            item["record"],
            plan,
            rejected=bool(item["rejected"]),
            now=now,
            region=self.region,
            wanted=wanted,
            engaged=item.get("engaged"),
        ):
            body = _dumps(event)
            for route in routes:
                if event_type in route["event_types"]:
                    self.events += 1
                    self.firehose.add(route["stream"], body.encode() + b"\n", self.pending)
            for sub in targets:
                types = sub.get("event_types")
                if types is not None and event_type not in types:
                    continue
                unsubscribe = f"{self.base_url}/?Action=Unsubscribe&SubscriptionArn={_arn(sub)}"
                fields = build_notification(
                    sub["topic_arn"], body, None, self.cert_url, now, unsubscribe_url=unsubscribe
                )
                self.events += 1
                self._enqueue(sub, fields, "Notification")

    def _publish(self, sub_ids: list[str], body: str) -> None:
        now = _now()
        for sub in (self.subs[s] for s in sub_ids if s in self.subs):
            unsubscribe = f"{self.base_url}/?Action=Unsubscribe&SubscriptionArn={_arn(sub)}"
            fields = build_notification(
                sub["topic_arn"], body, None, self.cert_url, now, unsubscribe_url=unsubscribe
            )
            self.events += 1
            self._enqueue(sub, fields, "Notification")

    def _enqueue(self, sub: dict[str, Any], fields: dict[str, str], kind: str) -> None:
        if self.pending >= self.max_pending:
            self.overflow += 1
            return
        self._to_sign.append((sub, fields, kind))
        self._has_work.set()

    # ---- signing (threads: the RSA work releases the GIL) ---------------------------------

    def _sign_batch(self, batch: Sequence[Unsigned]) -> list[Delivery]:
        started = time.monotonic()
        out = []
        for sub, fields, kind in batch:
            signed = sign_message(fields, self.key_pem, int(sub.get("signature_version", 1)))
            out.append(
                Delivery(
                    sub_id=sub["id"],
                    endpoint=sub["endpoint"],
                    kind=kind,
                    message_id=signed["MessageId"],
                    topic_arn=sub["topic_arn"],
                    sub_arn=_arn(sub) if kind == "Notification" else None,
                    body=_dumps(signed).encode(),
                    first_at=started,
                )
            )
        return out

    async def _signer(self, pool: ThreadPoolExecutor) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._has_work.wait()
            batch = [self._to_sign.popleft() for _ in range(min(SIGN_BATCH, len(self._to_sign)))]
            if not self._to_sign:
                self._has_work.clear()
            if not batch:
                continue
            self._signing.append(batch)
            try:
                deliveries = await loop.run_in_executor(pool, self._sign_batch, batch)
            finally:
                self._signing.remove(batch)
            for d in deliveries:
                self._queue.put_nowait(d)

    # ---- delivery -------------------------------------------------------------------------

    async def _sender(self, http: HttpPoster) -> None:
        while True:
            d = await self._queue.get()
            self._posting.add(d)
            try:
                await self._post(http, d)
            finally:
                self._posting.discard(d)

    async def _post(self, http: HttpPoster, d: Delivery) -> None:
        if d.kind == "Notification" and d.sub_id not in self.subs:
            return  # unsubscribed meanwhile: SNS stops delivering to a deleted subscription
        stats = self.stats.setdefault(d.sub_id, SubStats())
        d.attempts += 1
        try:
            status = await http.post(d.endpoint, d.headers(), d.body)
            stats.last_status = status
        except (TimeoutError, OSError, ValueError) as exc:
            status, stats.last_error = 0, f"{type(exc).__name__}: {exc}"[:200]
        if 200 <= status < 300:
            stats.delivered += 1
        elif 400 <= status < 500:
            stats.refused += 1
        elif time.monotonic() - d.first_at > self.retry_window_s:
            stats.dropped += 1
        else:
            stats.retried += 1
            delay = random.uniform(0, min(5.0, 0.05 * 2 ** min(d.attempts, 10)))
            self._retrying[d] = asyncio.get_running_loop().call_later(delay, self._requeue, d)

    def _requeue(self, d: Delivery) -> None:
        del self._retrying[d]
        self._queue.put_nowait(d)

    # ---- stop and resume ------------------------------------------------------------------

    def undelivered(self) -> tuple[list[Unsigned], list[Delivery]]:
        """Everything not yet delivered: unsigned envelopes and signed deliveries."""
        unsigned = [*(u for batch in self._signing for u in batch), *self._to_sign]
        signed = [*self._posting, *self._retrying]
        while not self._queue.empty():
            signed.append(self._queue.get_nowait())
        return unsigned, signed

    def resume(self, path: Path) -> None:
        """Queue a backlog written by `save_backlog`; subscriptions gone since are skipped."""
        resumed = skipped = 0
        now = time.monotonic()
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                item = json.loads(line)
                if "delivery" in item:
                    data = item["delivery"]
                    if data["sub_id"] not in self.subs:
                        skipped += 1
                        continue
                    data.update(body=data["body"].encode(), first_at=now, attempts=0)
                    self._queue.put_nowait(Delivery(**data))
                elif item["sub"]["id"] in self.subs:
                    self._to_sign.append(
                        (self.subs[item["sub"]["id"]], item["fields"], item["kind"])
                    )
                    self._has_work.set()
                else:
                    skipped += 1
                    continue
                resumed += 1
        path.unlink()
        log.info("events_backlog_resumed events=%d skipped_unsubscribed=%d", resumed, skipped)

    def stats_line(self) -> str:
        return _dumps(
            {
                "op": "stats",
                "pending": self.pending,
                "events": self.events,
                "overflow": self.overflow,
                "subs": {k: v.__dict__ for k, v in self.stats.items()},
                "firehose": self.firehose.stats_dict(),
            }
        )

    async def run(self, reader: asyncio.StreamReader) -> None:
        http = HttpPoster(timeout_s=HTTP_TIMEOUT_S)
        pool = ThreadPoolExecutor(max_workers=SIGN_THREADS, thread_name_prefix="sign")
        tasks = [asyncio.create_task(self._signer(pool)) for _ in range(SIGN_THREADS)]
        tasks += [asyncio.create_task(self._sender(http)) for _ in range(self.concurrency)]
        tasks.append(asyncio.create_task(self._report()))
        reading = asyncio.create_task(self._read(reader))
        orphaned = asyncio.create_task(_orphaned())
        try:
            await asyncio.wait([reading, orphaned], return_when=asyncio.FIRST_COMPLETED)
        finally:
            unsigned, signed = self.undelivered()  # before the senders let go of theirs
            for handle in self._retrying.values():
                handle.cancel()
            await _cancel([*tasks, reading, orphaned])
            pool.shutdown(wait=False, cancel_futures=True)
            http.close()
            firehose_left = await self.firehose.stop()
            if firehose_left:
                log.info("emitter_stopped firehose_records_dropped=%d", firehose_left)
            self._stopped(unsigned, signed)

    def _stopped(self, unsigned: list[Unsigned], signed: list[Delivery]) -> None:
        left = len(unsigned) + len(signed)
        if left and self.backlog_file is not None:
            save_backlog(self.backlog_file, unsigned, signed)
            log.info("emitter_stopped events_kept=%d file=%s", left, self.backlog_file)
        else:
            log.info("emitter_stopped events_dropped=%d", left)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while line := await reader.readline():
            self.handle(json.loads(line))

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            sys.stdout.write(self.stats_line() + "\n")
            sys.stdout.flush()


def save_backlog(path: Path, unsigned: list[Unsigned], signed: list[Delivery]) -> None:
    """One JSON line per undelivered event (`Emitter.resume` reads them back)."""
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for sub, fields, kind in unsigned:
            out.write(_dumps({"sub": sub, "fields": fields, "kind": kind}) + "\n")
        for d in signed:
            data = asdict(d)
            data["body"] = d.body.decode()
            out.write(_dumps({"delivery": data}) + "\n")
    tmp.replace(path)


async def _cancel(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel and wait, without ever waiting forever: a task whose cancellation was lost (a
    library swallowing it) is cancelled again, then left to the interpreter's exit."""
    for attempt in range(3):
        for task in tasks:
            task.cancel()
        _done, pending = await asyncio.wait(tasks, timeout=1.0)
        if not pending:
            return
        tasks = list(pending)
        log.warning("emitter_stop tasks_still_running=%d attempt=%d", len(tasks), attempt + 1)


async def _orphaned() -> None:
    """Return once the stand-in that started this process is gone."""
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(ORPHAN_CHECK_S)


def _arn(sub: dict[str, Any]) -> str:
    return f"{sub['topic_arn']}:{sub['id']}"


def _now() -> datetime:
    return datetime.now(UTC)


async def _main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=256 * 1024 * 1024)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    emitter = Emitter(
        key_pem=Path(args.key).read_bytes(),
        cert_url=args.cert_url,
        base_url=args.base_url,
        region=args.region,
        concurrency=args.concurrency,
        retry_window_s=args.retry_window_s,
        backlog_file=Path(args.backlog_file) if args.backlog_file else None,
    )
    await emitter.run(reader)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.ses_standin.emitter")
    parser.add_argument("--key", required=True)
    parser.add_argument("--cert-url", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    parser.add_argument("--retry-window-s", type=float, default=300.0)
    parser.add_argument(
        "--backlog-file", default=None, help="keep undelivered events here at stop (resumable)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    gc_pauses.install()
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
