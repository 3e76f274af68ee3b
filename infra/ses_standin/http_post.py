"""A small HTTP/1.1 POST client for the stand-in's SNS deliveries.

SNS delivers one notification per POST over kept-alive connections. An HTTP client library
spends ~150 µs of CPU per request on this machine; this one writes the request bytes and reads
the status, the headers it needs and the body (Content-Length, chunked, or until close), a
few µs. The stand-in is a test double: its CPU is taken from the product it measures.

`post` returns the status code (`post_reading` the status and the body: Firehose deliveries
check the answer's requestId); both raise OSError (refused, reset, closed before an answer)
or TimeoutError (no complete answer within the timeout). Those, like 5xx, are what SNS
retries. A connection is reused only after a complete answer that allows it.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    tls: bool
    path: bytes  # path and query, as sent
    authority: str  # Host header

    @classmethod
    def of(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(
            parts.hostname, parts.port or (443 if tls else 80), tls, path.encode(), parts.netloc
        )


class _Connection(asyncio.Protocol):
    """One connection; one request at a time; `answer` settles with (status, reusable)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.answer: asyncio.Future[tuple[int, bool]] | None = None
        self.closed = False
        self._buffer = bytearray()
        self._status = 0
        self._reusable = False
        self._length: int | None = None  # None: chunked or until close
        self._chunked = False
        self._body_at = -1  # offset of the body in the buffer once the head is read

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(
        self, request: bytes, loop: asyncio.AbstractEventLoop
    ) -> asyncio.Future[tuple[int, bool]]:
        assert self.transport is not None
        self.answer = loop.create_future()
        self._buffer.clear()
        self._body_at = -1
        self.transport.write(request)
        return self.answer

    def data_received(self, data: bytes) -> None:
        if self.answer is None or self.answer.done():
            return  # nothing asked: ignore (the connection is not reused after an error)
        self._buffer += data
        if self._body_at < 0 and not self._read_head():
            return
        self._maybe_done(eof=False)

    def _read_head(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                self._fail(OSError("response head too large"))
            return False
        lines = bytes(self._buffer[:end]).split(b"\r\n")
        try:
            version, status = lines[0].split(b" ", 2)[:2]
            self._status = int(status)
        except ValueError:
            self._fail(OSError(f"bad status line {lines[0][:80]!r}"))
            return False
        keep_alive = version == b"HTTP/1.1"
        self._length, self._chunked = None, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == b"content-length":
                self._length = int(value)
            elif name == b"transfer-encoding":
                self._chunked = value.endswith(b"chunked")
            elif name == b"connection":
                keep_alive = value == b"keep-alive" or (keep_alive and value != b"close")
        if 100 <= self._status < 200:  # informational: the real answer follows
            del self._buffer[: end + 4]
            return self._read_head() if self._buffer else False
        if self._status in (204, 304):
            self._length = 0
        self._reusable = keep_alive and (self._length is not None or self._chunked)
        self._body_at = end + 4
        return True

    def _maybe_done(self, *, eof: bool) -> None:
        body = len(self._buffer) - self._body_at
        if self._length is not None and not self._chunked:
            complete = body >= self._length
        elif self._chunked:
            complete = self._chunks_complete()
        else:
            complete = eof  # delimited by the end of the connection
        if complete and self.answer is not None and not self.answer.done():
            self.answer.set_result((self._status, self._reusable and not eof))

    def _chunks_complete(self) -> bool:
        at = self._body_at
        while True:
            line_end = self._buffer.find(b"\r\n", at)
            if line_end < 0:
                return False
            try:
                size = int(bytes(self._buffer[at:line_end]).split(b";")[0], 16)
            except ValueError:
                self._fail(OSError("bad chunk size"))
                return False
            if size == 0:
                return self._buffer.find(b"\r\n\r\n", line_end) >= 0  # the (empty) trailer
            at = line_end + 2 + size + 2
            if at > len(self._buffer):
                return False

    def body(self) -> bytes:
        """The body of the answer just completed (chunks joined)."""
        raw = bytes(self._buffer[self._body_at :])
        if self._chunked:
            out, at = bytearray(), 0
            while True:
                line_end = raw.find(b"\r\n", at)
                size = int(raw[at:line_end].split(b";")[0], 16)
                if size == 0:
                    return bytes(out)
                out += raw[line_end + 2 : line_end + 2 + size]
                at = line_end + 2 + size + 2
        return raw if self._length is None else raw[: self._length]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.answer is not None and not self.answer.done():
            if self._body_at >= 0 and self._length is None and not self._chunked:
                self._maybe_done(eof=True)
            else:
                self.answer.set_exception(OSError(f"connection closed before the answer: {exc}"))

    def _fail(self, exc: Exception) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()


class HttpPoster:
    """POSTs to any number of endpoints, keeping idle connections per host for reuse."""

    def __init__(self, *, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}
        self._targets: dict[str, Target] = {}
        self._tls: ssl.SSLContext | None = None

    async def post(self, url: str, headers: Sequence[tuple[str, str]], body: bytes) -> int:
        return (await self._request(url, headers, body, read=False))[0]

    async def post_reading(
        self, url: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> tuple[int, bytes]:
        return await self._request(url, headers, body, read=True)

    async def _request(
        self, url: str, headers: Sequence[tuple[str, str]], body: bytes, *, read: bool
    ) -> tuple[int, bytes]:
        target = self._targets.get(url)
        if target is None:
            target = self._targets[url] = Target.of(url)
        head = b"".join(f"{k}: {v}\r\n".encode() for k, v in headers)
        request = (
            b"POST "
            + target.path
            + b" HTTP/1.1\r\nHost: "
            + target.authority.encode()
            + b"\r\n"
            + head
            + b"Content-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        loop = asyncio.get_running_loop()
        conn = await self._connection(target, loop)
        timer = loop.call_later(self.timeout_s, self._expire, conn)
        try:
            status, reusable = await conn.send(request, loop)
        except BaseException:
            if conn.transport is not None:
                conn.transport.abort()
            raise
        finally:
            timer.cancel()
        answer = conn.body() if read else b""
        if reusable and not conn.closed:
            self._idle.setdefault((target.host, target.port, target.tls), []).append(conn)
        elif conn.transport is not None:
            conn.transport.close()
        return status, answer

    async def _connection(self, target: Target, loop: asyncio.AbstractEventLoop) -> _Connection:
        idle = self._idle.get((target.host, target.port, target.tls))
        while idle:
            conn = idle.pop()
            if not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                return conn
        tls = None
        if target.tls:
            tls = self._tls = self._tls or ssl.create_default_context()
        # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation that
        # arrives as the connection completes, and the stopping emitter then waits forever.
        async with asyncio.timeout(self.timeout_s):
            _transport, conn = await loop.create_connection(
                _Connection, target.host, target.port, ssl=tls
            )
        return conn

    @staticmethod
    def _expire(conn: _Connection) -> None:
        conn._fail(TimeoutError("no complete answer in time"))

    def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()
