"""`faust_offsets._resume` drives a half-run coroutine like asyncio.Task would (the fetch
loop's fast path relies on it when a record's callback has to wait)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from streams.faust_offsets import _resume


def _drive(coro: Any) -> asyncio.Future[Any]:
    """Run the first step by hand, as the fast path does, then let _resume drive the rest."""
    return asyncio.ensure_future(_resume(coro, coro.send(None)))


async def _waits_for(event: asyncio.Event, log: list[str]) -> str:
    log.append("started")
    try:
        await event.wait()
        await asyncio.sleep(0)
        await asyncio.sleep(0.01)
        return "done"
    finally:
        log.append("cleaned up")


def test_a_suspended_coroutine_finishes_with_its_value() -> None:
    async def main() -> None:
        event, log = asyncio.Event(), []
        coro = _waits_for(event, log)
        task = _drive(coro)
        await asyncio.sleep(0.01)
        assert not task.done()
        event.set()
        assert await task == "done"
        assert log == ["started", "cleaned up"]

    asyncio.run(main())


def test_the_awaited_futures_exception_reaches_the_coroutine() -> None:
    async def fails(fut: asyncio.Future[int]) -> int:
        try:
            return await fut
        except KeyError:
            return -1

    async def main() -> None:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        coro = fails(fut)
        task = _drive(coro)
        fut.set_exception(KeyError("x"))
        assert await task == -1

    asyncio.run(main())


def test_cancelling_the_driver_cancels_the_coroutine() -> None:
    async def main() -> None:
        event, log = asyncio.Event(), []
        coro = _waits_for(event, log)
        task = _drive(coro)
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert log == ["started", "cleaned up"]

    asyncio.run(main())


def test_cancelling_during_a_bare_yield_is_thrown_into_the_coroutine() -> None:
    async def spins(log: list[str]) -> None:
        try:
            while True:
                await asyncio.sleep(0)
        except asyncio.CancelledError:
            log.append("cancelled inside")
            raise

    async def main() -> None:
        log: list[str] = []
        coro = spins(log)
        task = _drive(coro)
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert log == ["cancelled inside"]

    asyncio.run(main())
