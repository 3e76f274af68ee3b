"""The webhook's HTTP server over real loopback sockets: keep-alive, order, limits, errors."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from infra.process import free_port
from producers.http_lean import LeanServer, Request, Response, Router, encode_response

MAX_BODY = 1000


class Seen:
    def __init__(self) -> None:
        self.requests: list[Request] = []


def router(seen: Seen) -> Router:
    async def echo(request: Request) -> Response:
        seen.requests.append(request)
        delay = float(request.headers.get("x-delay", "0"))
        if delay:
            await asyncio.sleep(delay)
        return Response(200, request.body or request.path.encode())

    async def boom(request: Request) -> Response:
        seen.requests.append(request)
        raise RuntimeError("handler bug")

    async def tail(request: Request) -> Response:
        return Response.text(200, "tail=" + request.params["tail"])

    async def big(request: Request) -> Response:
        seen.requests.append(request)
        return Response(200, b"z" * 256 * 1024)

    r = Router()
    r.add("GET", "/big", big)
    r.add("POST", "/echo", echo)
    r.add("GET", "/echo", echo)
    r.add("POST", "/boom", boom)
    r.add_prefix("GET", "/u/", tail)
    return r


@asynccontextmanager
async def server(idle_timeout_s: float = 75.0) -> AsyncIterator[tuple[int, Seen, LeanServer]]:
    seen = Seen()
    port = free_port()
    lean = LeanServer(router(seen), max_body=MAX_BODY, idle_timeout_s=idle_timeout_s)
    await lean.start("127.0.0.1", port)
    try:
        yield port, seen, lean
    finally:
        await lean.stop(grace_s=0.5)


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    length = int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(length), 5) if length else b""
    return status, headers, body


async def read_response_rest(reader: asyncio.StreamReader) -> tuple[dict[str, str], bytes]:
    """The rest of a response whose first 9 bytes were read."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
    return headers, await reader.readexactly(int(headers.get("content-length", "0")))


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode()
        + body
    )


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 20))


async def closed(reader: asyncio.StreamReader) -> bool:
    return await asyncio.wait_for(reader.read(1), 5) == b""


def test_keep_alive_answers_several_requests_on_one_connection() -> None:
    async def t() -> None:
        async with server() as (port, seen, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            for i in range(3):
                writer.write(post("/echo", f"body-{i}".encode()))
                status, headers, body = await read_response(reader)
                assert (status, body) == (200, f"body-{i}".encode())
                assert headers["content-length"] == str(len(body))
                assert "connection" not in headers  # stays open
            assert len(seen.requests) == 3
            writer.close()

    run(t)


def test_pipelined_requests_are_answered_in_order() -> None:
    async def t() -> None:
        async with server() as (port, _, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                post("/echo", b"slow", "x-delay: 0.2\r\n")
                + post("/echo", b"b")
                + post("/echo", b"c")
            )
            assert [(await read_response(reader))[2] for _ in range(3)] == [b"slow", b"b", b"c"]
            writer.close()

    run(t)


def test_chunked_body_is_assembled() -> None:
    async def t() -> None:
        async with server() as (port, seen, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            )
            assert (await read_response(reader))[:3:2] == (200, b"hello world")
            assert seen.requests[0].body == b"hello world"
            writer.close()

    run(t)


@pytest.mark.parametrize("chunked", [False, True])
def test_oversized_body_gets_413_and_reaches_no_handler(chunked: bool) -> None:
    async def t() -> None:
        async with server() as (port, seen, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            big = b"x" * (MAX_BODY + 1)
            if chunked:
                writer.write(
                    b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                    + f"{len(big):x}\r\n".encode()
                    + big
                    + b"\r\n0\r\n\r\n"
                )
            else:
                writer.write(post("/echo", big))
            status, headers, _ = await read_response(reader)
            assert status == 413 and headers["connection"] == "close"
            assert await closed(reader)
            assert seen.requests == []
            writer.close()

    run(t)


def test_declared_oversized_body_gets_413_before_it_is_sent() -> None:
    async def t() -> None:
        async with server() as (port, seen, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                f"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_BODY + 1}\r\n\r\n".encode()
            )
            status, headers, _ = await read_response(reader)  # no body byte sent
            assert status == 413 and headers["connection"] == "close"
            assert seen.requests == []
            writer.close()

    run(t)


def test_body_at_the_limit_is_accepted() -> None:
    async def t() -> None:
        async with server() as (port, _, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(post("/echo", b"y" * MAX_BODY))
            assert (await read_response(reader))[0] == 200
            writer.close()

    run(t)


def test_unknown_path_404_wrong_method_405_with_allow_head_has_no_body() -> None:
    async def t() -> None:
        async with server() as (port, _, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /nowhere HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await read_response(reader))[0] == 404
            writer.write(b"DELETE /echo HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, _ = await read_response(reader)
            assert status == 405 and headers["allow"] == "GET, HEAD, POST"
            writer.write(b"POST /u/abc HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
            status, headers, _ = await read_response(reader)
            assert status == 405 and headers["allow"] == "GET, HEAD"
            writer.write(b"GET /u/a/b HTTP/1.1\r\nHost: x\r\n\r\n")  # a token has no slash
            assert (await read_response(reader))[0] == 404
            writer.write(b"GET /u/tok?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await read_response(reader))[2] == b"tail=tok"
            writer.write(b"HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert b"Content-Length: 5\r\n" in head  # that of GET's body "/echo"
            writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")  # nothing sent after HEAD
            assert await asyncio.wait_for(reader.readexactly(9), 5) == b"HTTP/1.1 "
            assert (await read_response_rest(reader))[1] == b"/echo"
            writer.close()

    run(t)


def test_http10_and_connection_close_close_after_the_answer() -> None:
    async def t() -> None:
        async with server() as (port, _, _):
            for request in (
                b"GET /echo HTTP/1.0\r\n\r\n",
                b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
            ):
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.write(request)
                status, headers, _ = await read_response(reader)
                assert status == 200 and headers["connection"] == "close"
                assert await closed(reader)
                writer.close()

    run(t)


def test_malformed_request_gets_400_and_close() -> None:
    async def t() -> None:
        async with server() as (port, seen, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /echo HTTP/1.1\r\nContent-Length: nope\r\n\r\n")
            assert (await read_response(reader))[0] == 400
            assert await closed(reader)
            assert seen.requests == []
            writer.close()

    run(t)


def test_oversized_headers_get_431() -> None:
    async def t() -> None:
        async with server() as (port, _, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /echo HTTP/1.1\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n")
            assert (await read_response(reader))[0] == 431
            writer.close()

    run(t)


def test_a_client_that_does_not_read_gets_no_more_requests_handled() -> None:
    async def t() -> None:
        async with server() as (port, seen, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**20)
            writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 40)
            await asyncio.sleep(0.5)  # reading nothing: the server's write buffer fills
            handled = len(seen.requests)
            assert handled < 40, "every request handled although no answer was read"
            bodies = [(await read_response(reader))[2] for _ in range(40)]  # then all come
            assert all(len(b) == 256 * 1024 for b in bodies) and len(seen.requests) == 40
            writer.close()

    run(t)


def test_handler_exception_is_a_500_and_the_connection_keeps_working() -> None:
    async def t() -> None:
        async with server() as (port, _, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(post("/boom", b"x"))
            assert (await read_response(reader))[0] == 500
            writer.write(post("/echo", b"after"))
            assert (await read_response(reader))[2] == b"after"
            writer.close()

    run(t)


def test_expect_100_continue_is_answered_before_the_body() -> None:
    async def t() -> None:
        async with server() as (port, _, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(post("/echo", b"", "Expect: 100-continue\r\n").replace(b": 0", b": 4"))
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert interim.startswith(b"HTTP/1.1 100 ")
            writer.write(b"data")
            assert (await read_response(reader))[2] == b"data"
            writer.close()

    run(t)


def test_idle_connections_are_closed() -> None:
    async def t() -> None:
        async with server(idle_timeout_s=0.3) as (port, _, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(post("/echo", b"x"))
            await read_response(reader)
            assert await asyncio.wait_for(reader.read(1), 3) == b""
            writer.close()

    run(t)


def test_stop_lets_an_answer_in_progress_go_out() -> None:
    async def t() -> None:
        async with server() as (port, _, lean):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(post("/echo", b"late", "x-delay: 0.2\r\n"))
            await asyncio.sleep(0.05)
            stopping = asyncio.create_task(lean.stop(grace_s=2.0))
            status, headers, body = await read_response(reader)
            assert (status, body, headers["connection"]) == (200, b"late", "close")
            await stopping
            writer.close()

    run(t)


def test_encode_response_has_length_and_extra_headers() -> None:
    raw = encode_response(Response(503, b"no", headers=(("Allow", "GET"),)), keep_alive=True)
    assert raw.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"\r\nContent-Length: 2\r\n" in raw and b"\r\nAllow: GET\r\n" in raw
    assert raw.endswith(b"\r\n\r\nno")
