"""A small HTTP/1.1 server on asyncio.Protocol + httptools, for the webhook.

Why not aiohttp here: SNS sends one small POST per event, and aiohttp's request and response
objects, routing and stream machinery cost several times what the parse and the answer need
(see docs/decisions.md). This serves exactly what the webhook uses:

- keep-alive (HTTP/1.1 by default, HTTP/1.0 on request), requests of one connection answered
  in order, pipelined ones included; `Connection: close` after a parse error or on request;
- bodies by Content-Length or chunked, capped: 413 (and close) once a body exceeds the cap,
  before it is read; `Expect: 100-continue` answered; 431 for oversized headers;
- exact-path and prefix routes: 404 for an unknown path, 405 with `Allow` for a wrong method,
  HEAD wherever GET is (no body sent);
- a client that does not read its answers gets no more of them handled (write flow control);
- idle keep-alive connections closed after `idle_timeout_s`; a handler's exception is a 500.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from email.utils import formatdate
from typing import Any, cast

import httptools

log = logging.getLogger("flashsend.webhook.http")

MAX_HEADER_BYTES = 16 * 1024  # request line + all header lines
MAX_PIPELINED = 16  # requests parsed ahead of their answers before reading pauses
IDLE_TIMEOUT_S = 75.0  # as aiohttp's keep-alive default

_REASONS = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str  # without the query string, percent-encoding kept
    query: str
    headers: dict[str, str]  # names lowercased; a repeated header keeps its last value
    body: bytes
    remote: str | None
    params: dict[str, str] = field(default_factory=dict)  # {"tail": …} for a prefix route

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name, default)


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def text(cls, status: int, text: str) -> Response:
        return cls(status, text.encode())


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class Router:
    """Exact paths first, then the longest matching prefix (its rest is `params["tail"]`)."""

    def __init__(self) -> None:
        self._exact: dict[str, dict[str, Handler]] = {}
        self._prefixes: list[tuple[str, dict[str, Handler]]] = []

    def add(self, method: str, path: str, handler: Handler) -> None:
        self._exact.setdefault(path, {})[method] = handler

    def add_prefix(self, method: str, prefix: str, handler: Handler) -> None:
        for known, methods in self._prefixes:
            if known == prefix:
                methods[method] = handler
                return
        self._prefixes.append((prefix, {method: handler}))
        self._prefixes.sort(key=lambda item: -len(item[0]))

    def resolve(self, method: str, path: str) -> tuple[Handler | None, dict[str, str], int, str]:
        """(handler, params, status if none, Allow if 405)."""
        methods = self._exact.get(path)
        params: dict[str, str] = {}
        if methods is None:
            for prefix, candidates in self._prefixes:
                tail = path[len(prefix) :]
                if path.startswith(prefix) and tail and "/" not in tail:
                    methods, params = candidates, {"tail": tail}
                    break
        if methods is None:
            return None, params, 404, ""
        handler = methods.get("GET" if method == "HEAD" else method)
        if handler is None:
            allowed = sorted({*methods, *(["HEAD"] if "GET" in methods else [])})
            return None, params, 405, ", ".join(allowed)
        return handler, params, 0, ""


_date_cache: tuple[int, bytes] = (0, b"")


def _date_header() -> bytes:
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, formatdate(now, usegmt=True).encode())
    return _date_cache[1]


def encode_response(response: Response, *, keep_alive: bool, head: bool = False) -> bytes:
    """Status line, headers and body (none for HEAD, Content-Length still that of the body)."""
    reason = _REASONS.get(response.status, "Unknown")
    lines = [
        f"HTTP/1.1 {response.status} {reason}\r\n".encode(),
        b"Date: ",
        _date_header(),
        f"\r\nContent-Type: {response.content_type}\r\n"
        f"Content-Length: {len(response.body)}\r\n".encode(),
    ]
    for name, value in response.headers:
        lines.append(f"{name}: {value}\r\n".encode())
    if not keep_alive:
        lines.append(b"Connection: close\r\n")
    lines.append(b"\r\n")
    if not head:
        lines.append(response.body)
    return b"".join(lines)


class _Limit(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status, self.text = status, text


class HttpProtocol(asyncio.Protocol):
    """One connection: parse, dispatch in order, answer."""

    def __init__(self, server: LeanServer) -> None:
        self.server = server
        self.router = server.router
        self.max_body = server.max_body
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.remote: str | None = None
        self.queue: deque[tuple[Request | Response, bool, bool]] = deque()
        self.busy = False
        self.closing = False
        self.failed = False  # a parse error or limit: answer what is queued, then close
        self.paused = False
        self.write_paused = False  # the client reads slower than we answer: take no more
        self.last_active = time.monotonic()
        self._reset()

    def _reset(self) -> None:
        self._url = b""
        self._headers: dict[str, str] = {}
        self._header_bytes = 0
        self._body: list[bytes] = []
        self._body_len = 0

    # --- asyncio.Protocol -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if peer else None
        self.server.connections.add(self)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if not self.busy:
            self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.closing = True
        self.queue.clear()

    def data_received(self, data: bytes) -> None:
        if self.closing or self.failed:
            return
        self.last_active = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "upgrade not supported")
        except (httptools.HttpParserError, _Limit) as exc:
            # httptools wraps what a callback raises: a _Limit comes back as its context
            limit = exc if isinstance(exc, _Limit) else exc.__context__
            if isinstance(limit, _Limit):
                self._fail(limit.status, limit.text)
            else:
                self._fail(400, f"bad request: {exc}")

    # --- httptools callbacks ----------------------------------------------------------
    def on_message_begin(self) -> None:
        self._reset()

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._count_header_bytes(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value) + 4)
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def _count_header_bytes(self, n: int) -> None:
        self._header_bytes += n
        if self._header_bytes > MAX_HEADER_BYTES:
            raise _Limit(431, "request headers too large")

    def on_headers_complete(self) -> None:
        length = self._headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            raise _Limit(413, "request body too large")
        expect = self._headers.get("expect", "").lower()
        if expect == "100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_len += len(body)
        if self._body_len > self.max_body:
            raise _Limit(413, "request body too large")
        self._body.append(body)

    def on_message_complete(self) -> None:
        parsed = httptools.parse_url(self._url)
        method = self.parser.get_method().decode("ascii")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        request = Request(
            method,
            parsed.path.decode("latin-1") if parsed.path else "/",
            parsed.query.decode("latin-1") if parsed.query else "",
            self._headers,
            body,
            self.remote,
        )
        keep_alive = self.parser.should_keep_alive()
        self._enqueue(request, keep_alive, method == "HEAD")

    # --- dispatch ---------------------------------------------------------------------
    def _enqueue(self, item: Request | Response, keep_alive: bool, head: bool) -> None:
        self.queue.append((item, keep_alive, head))
        if len(self.queue) >= MAX_PIPELINED and self.transport is not None and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        if not self.busy:
            self._next()

    def _next(self) -> None:
        while self.queue and not self.closing and not self.write_paused:
            item, keep_alive, head = self.queue.popleft()
            if isinstance(item, Response):
                self._write(item, keep_alive, head)
                continue
            handler, params, status, allow = self.router.resolve(item.method, item.path)
            if handler is None:
                extra = (("Allow", allow),) if allow else ()
                text = "method not allowed" if status == 405 else "not found"
                self._write(Response(status, text.encode(), headers=extra), keep_alive, head)
                continue
            if params:
                item = Request(
                    item.method, item.path, item.query, item.headers, item.body, item.remote, params
                )
            self.busy = True
            task = asyncio.get_running_loop().create_task(handler(item))
            task.add_done_callback(
                functools.partial(self._answered, keep_alive=keep_alive, head=head)
            )
            return
        if (
            self.paused
            and not self.write_paused
            and self.transport is not None
            and not self.closing
        ):
            self.paused = False
            self.transport.resume_reading()

    def _answered(self, task: asyncio.Task[Response], *, keep_alive: bool, head: bool) -> None:
        self.busy = False
        if task.cancelled():
            response = Response(503, b"shutting down")
            keep_alive = False
        elif (exc := task.exception()) is not None:
            log.error("handler failed", exc_info=exc)
            response = Response(500, b"internal error")
        else:
            response = task.result()
        self._write(response, keep_alive, head)
        self._next()

    def _write(self, response: Response, keep_alive: bool, head: bool) -> None:
        if self.closing or self.transport is None:
            return
        keep_alive = keep_alive and not self.server.stopping
        self.transport.write(encode_response(response, keep_alive=keep_alive, head=head))
        self.last_active = time.monotonic()
        if not keep_alive:
            self.closing = True
            self.transport.close()

    def _fail(self, status: int, text: str) -> None:
        """Answer after what is already queued, then close: the stream is out of sync."""
        self.failed = True
        if self.transport is not None:
            self.transport.pause_reading()
        self.queue.append((Response(status, text.encode()), False, False))
        if not self.busy:
            self._next()

    def idle_for(self, now: float) -> float:
        return 0.0 if self.busy or self.queue else now - self.last_active


class LeanServer:
    """Owns the listening socket(s) and the open connections."""

    def __init__(
        self, router: Router, *, max_body: int, idle_timeout_s: float = IDLE_TIMEOUT_S
    ) -> None:
        self.router = router
        self.max_body = max_body
        self.idle_timeout_s = idle_timeout_s
        self.connections: set[HttpProtocol] = set()
        self.stopping = False
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: HttpProtocol(self), host, port, backlog=1024, reuse_port=reuse_port or None
        )
        self._sweeper = loop.create_task(self._close_idle())

    async def _close_idle(self) -> None:
        while True:
            await asyncio.sleep(min(5.0, self.idle_timeout_s / 2))
            now = time.monotonic()
            for conn in list(self.connections):
                if conn.idle_for(now) > self.idle_timeout_s and conn.transport is not None:
                    conn.transport.close()

    async def stop(self, grace_s: float = 2.0) -> None:
        """Stop accepting, let answers in progress go out (up to `grace_s`), close the rest."""
        self.stopping = True
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            self._server.close()
        deadline = time.monotonic() + grace_s
        while any(c.busy for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        if self._server is not None:
            await self._server.wait_closed()
