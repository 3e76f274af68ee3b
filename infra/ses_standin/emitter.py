"""The stand-in's SNS deliverer, run as a child process: build, sign and POST notifications.

    python -m infra.ses_standin.emitter --key KEY.pem --cert-url URL --base-url URL

Why a child process: every event costs an RSA-2048 signature (~0.5 ms) and an HTTP request;
done in the stand-in's own process that work would hold the GIL away from the SES request
handlers, i.e. slow the send path. Here the send path pays one pipe write per batch.

Protocol (JSON lines; `emission.py` is the other end):
- stdin  `{"op": "subs", "subs": [...]}`  the confirmed subscriptions (replaces the last list)
- stdin  `{"op": "confirm", "sub": {...}, "subscribe_url": "…"}`  send a SubscriptionConfirmation
- stdin  `{"op": "msgs", "items": [{"record", "plan", "rejected", "subs"}, …]}`  accepted mail
- stdout `{"op": "stats", …}` twice a second.

Delivery follows SNS's HTTP/S rules: a 2xx answer is delivered, any other 4xx is given up at
once (the endpoint refused the message; retrying cannot help), a 5xx, timeout or connection
error is retried with exponential backoff and jitter until the retry window (SNS: at most an
hour) has passed, then dropped and counted. stdin EOF (the stand-in stopped) ends the process.
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
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from infra.ses_standin.event_records import build_events
from producers.sns_sign import build_notification, build_subscription_confirmation, sign_message

log = logging.getLogger("infra.ses_standin.emitter")

SIGN_BATCH = 64
HTTP_TIMEOUT_S = 15.0  # SNS's HTTP/S request timeout
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@dataclass
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
    concurrency: int = 32
    retry_window_s: float = 300.0
    max_pending: int = 500_000
    subs: dict[str, dict[str, Any]] = field(default_factory=dict)
    stats: dict[str, SubStats] = field(default_factory=dict)
    events: int = 0
    overflow: int = 0
    _to_sign: deque[tuple[dict[str, Any], dict[str, str], str]] = field(default_factory=deque)
    _has_work: asyncio.Event = field(default_factory=asyncio.Event)
    _queue: asyncio.Queue[Delivery] = field(default_factory=asyncio.Queue)
    _inflight: int = 0
    _waiting_retry: int = 0

    @property
    def pending(self) -> int:
        return len(self._to_sign) + self._queue.qsize() + self._inflight + self._waiting_retry

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

    def _plan_message(self, item: dict[str, Any]) -> None:
        targets = [self.subs[s] for s in item["subs"] if s in self.subs]
        if not targets:
            return
        now = _now()
        plan = [(str(a), str(o)) for a, o in item["plan"]]
        for event_type, event in build_events(
            item["record"], plan, rejected=bool(item["rejected"]), now=now, region=self.region
        ):
            body = _dumps(event)
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

    def _enqueue(self, sub: dict[str, Any], fields: dict[str, str], kind: str) -> None:
        if self.pending >= self.max_pending:
            self.overflow += 1
            return
        self._to_sign.append((sub, fields, kind))
        self._has_work.set()

    # ---- signing (threads: the RSA work releases the GIL) ---------------------------------

    def _sign_batch(
        self, batch: Sequence[tuple[dict[str, Any], dict[str, str], str]]
    ) -> list[Delivery]:
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
            self._inflight += len(batch)
            try:
                deliveries = await loop.run_in_executor(pool, self._sign_batch, batch)
            finally:
                self._inflight -= len(batch)
            for d in deliveries:
                self._queue.put_nowait(d)

    # ---- delivery -------------------------------------------------------------------------

    async def _sender(self, session: aiohttp.ClientSession) -> None:
        while True:
            d = await self._queue.get()
            self._inflight += 1
            try:
                await self._post(session, d)
            finally:
                self._inflight -= 1

    async def _post(self, session: aiohttp.ClientSession, d: Delivery) -> None:
        if d.kind == "Notification" and d.sub_id not in self.subs:
            return  # unsubscribed meanwhile: SNS stops delivering to a deleted subscription
        stats = self.stats.setdefault(d.sub_id, SubStats())
        headers = {
            "x-amz-sns-message-type": d.kind,
            "x-amz-sns-message-id": d.message_id,
            "x-amz-sns-topic-arn": d.topic_arn,
            "Content-Type": "text/plain; charset=UTF-8",
            "User-Agent": "Amazon Simple Notification Service Agent",
        }
        if d.sub_arn:
            headers["x-amz-sns-subscription-arn"] = d.sub_arn
        d.attempts += 1
        try:
            async with session.post(d.endpoint, data=d.body, headers=headers) as response:
                await response.read()
                status = response.status
            stats.last_status = status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
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
            self._waiting_retry += 1
            asyncio.get_running_loop().call_later(delay, self._requeue, d)

    def _requeue(self, d: Delivery) -> None:
        self._waiting_retry -= 1
        self._queue.put_nowait(d)

    def stats_line(self) -> str:
        return _dumps(
            {
                "op": "stats",
                "pending": self.pending,
                "events": self.events,
                "overflow": self.overflow,
                "subs": {k: v.__dict__ for k, v in self.stats.items()},
            }
        )

    async def run(self, reader: asyncio.StreamReader) -> None:
        timeout = aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
        connector = aiohttp.TCPConnector(limit=self.concurrency)
        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sign")
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            tasks = [asyncio.create_task(self._signer(pool)) for _ in range(2)]
            tasks += [asyncio.create_task(self._sender(session)) for _ in range(self.concurrency)]
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

    async def _report(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            sys.stdout.write(self.stats_line() + "\n")
            sys.stdout.flush()


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
    )
    await emitter.run(reader)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.ses_standin.emitter")
    parser.add_argument("--key", required=True)
    parser.add_argument("--cert-url", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--retry-window-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level="INFO", stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
