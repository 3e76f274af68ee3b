"""A lean SNS-style HTTP/1.1 load generator for the webhook benchmark (its Firehose path too).

SNS delivers each notification as one POST on a kept-alive connection, one request at a time
per connection. This does the same with requests whose bytes are built before the clock
starts, over raw asyncio protocols: a few µs of CPU per request where an HTTP client library
spends ~150 µs, so on a two-core machine the generator takes little of the CPU the webhook
is measured on (`post_all` returns its own CPU time so the bench can show it).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

# SNS opens as many connections as its delivery rate needs (nothing limits it but a
# subscription's throttlePolicy). With too few, each waits out its answer (~10 ms: the
# producer lingers for company, then the broker acknowledges) and a bench measures its own
# connections: 64 held one webhook process to ~6,000 events/s at 0.74 of a core here.
CONCURRENCY = 256
# Records per Firehose delivery request in the benchmark: ~0.7 MB of body, what a stream
# buffering 1 MiB sends.
FIREHOSE_BATCH = 500

_CONTENT_LENGTH = b"\r\ncontent-length:"


@dataclass(frozen=True)
class PostResult:
    seconds: float  # wall time from the first request to the last answer
    latencies: list[float]  # per request, seconds
    cpu_s: float  # this process's CPU time while posting


def latency_ms(latencies: Sequence[float]) -> dict[str, float]:
    """Request latency percentiles in ms (p50, p90, p99, max)."""
    # Imported here: `flashsend feedback --help` imports this module, mail_bench takes 0.2 s.
    from flashsend.lab.mail_bench import percentile

    return {
        q: round(percentile(list(latencies), p) * 1000, 1)
        for q, p in (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))
    }


def generator_cost(posted: PostResult, events: int) -> dict[str, float]:
    """The load generator's own CPU: per event, and in cores over the run."""
    return {
        "cpu_us_per_event": round(posted.cpu_s * 1e6 / events, 1),
        "cores": round(posted.cpu_s / posted.seconds, 2),
    }


class WebhookRefused(RuntimeError):
    """The webhook answered something other than 200."""


def sns_headers(message_type: str = "Notification") -> tuple[tuple[str, str], ...]:
    """The headers SNS sends with each HTTP/S delivery."""
    return (
        ("x-amz-sns-message-type", message_type),
        ("Content-Type", "text/plain; charset=UTF-8"),
        ("User-Agent", "Amazon Simple Notification Service Agent"),
    )


NOTIFICATION_HEADERS = sns_headers()


def build_request(
    host: str, path: str, body: bytes, headers: Sequence[tuple[str, str]] = NOTIFICATION_HEADERS
) -> bytes:
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers)
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\n{lines}Content-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


class _Connection(asyncio.Protocol):
    """Sends the shared queue's requests one at a time and reads each answer."""

    def __init__(self, queue: deque[bytes], latencies: list[float], done: asyncio.Future[None]):
        self.queue = queue
        self.latencies = latencies
        self.done = done
        self.buffer = b""
        self.sent_at = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._send_next()

    def _send_next(self) -> None:
        assert self.transport is not None
        if not self.queue:
            self.transport.close()
            return
        self.sent_at = time.perf_counter()
        self.transport.write(self.queue.popleft())

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end]
        at = head.lower().find(_CONTENT_LENGTH)
        length = 0
        if at >= 0:
            line_end = head.find(b"\r\n", at + 2)
            length = int(head[at + len(_CONTENT_LENGTH) : None if line_end < 0 else line_end])
        if len(self.buffer) < end + 4 + length:
            return
        status = int(head[9:12])
        body = self.buffer[end + 4 : end + 4 + length]
        self.buffer = self.buffer[end + 4 + length :]
        if status != 200:
            self._fail(WebhookRefused(f"webhook answered {status}: {body[:200]!r}"))
            return
        self.latencies.append(time.perf_counter() - self.sent_at)
        self._send_next()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.queue or self.buffer:
            self._fail(ConnectionError(f"connection lost with work left: {exc}"))
        elif not self.done.done():
            self.done.set_result(None)

    def _fail(self, exc: Exception) -> None:
        if not self.done.done():
            self.done.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()


async def post_all(
    url: str,
    bodies: Sequence[bytes],
    concurrency: int,
    headers: Sequence[tuple[str, str]] = NOTIFICATION_HEADERS,
) -> PostResult:
    """POST every body to `url` over `concurrency` connections, with `headers` (SNS's unless
    told); raises on any non-200."""
    parts = urlsplit(url)
    return await post_requests(
        url,
        [build_request(parts.netloc, parts.path or "/", b, headers) for b in bodies],
        concurrency,
    )


async def post_requests(url: str, requests: Sequence[bytes], concurrency: int) -> PostResult:
    """Send every ready-made HTTP request (`build_request`) to `url`'s host over
    `concurrency` connections; raises on any non-200."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    queue = deque(requests)
    latencies: list[float] = []
    loop = asyncio.get_running_loop()
    cpu0, began = time.process_time(), time.perf_counter()
    waits = []
    for _ in range(max(1, min(concurrency, len(requests)))):
        done: asyncio.Future[None] = loop.create_future()
        await loop.create_connection(
            functools.partial(_Connection, queue, latencies, done), host, port
        )
        waits.append(done)
    await asyncio.gather(*waits)
    return PostResult(time.perf_counter() - began, latencies, time.process_time() - cpu0)
