"""Live progress as Server-Sent Events: one poller per campaign, however many listen.

The first listener of a campaign starts its poller; it reads the trigger-kept counters once
per interval (`status_view`: ~1 ms whatever the campaign's size) and hands the same frame to
every listener's queue; the last listener to leave stops it. A listener that cannot keep up
loses old frames, never the newest (its queue holds one).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from psycopg_pool import ConnectionPool

from flashsend.errors import NotFound
from sinks.campaign_views import status_view

log = logging.getLogger("flashsend.api.events")
FINAL = frozenset({"done", "cancelled", "failed"})


def progress_frame(view: dict[str, Any], now: float) -> dict[str, Any]:
    """What a frame carries: counts, rate, ETA, the paused reason, the feedback gate's wait."""
    rate = float(view.get("send_rate_per_s") or 0.0)
    left = int(view.get("pending") or 0) + int(view.get("sending") or 0)
    keys = (
        "id",
        "status",
        "reason",
        "recipients",
        "pending",
        "sending",
        "sent",
        "failed",
        "unknown",
        "skipped",
        "cancelled",
        "held",
        "rate_limit",
        "channel",
    )
    return {
        **{k: view.get(k) for k in keys},
        "rate_per_s": rate,
        "eta_s": round(left / rate, 1) if rate > 0 and left else None,
        "paused_reason": view.get("reason") if view.get("status") == "paused" else None,
        "feedback_lag_s": view.get("feedback_lag_s"),
        "at": now,
    }


class _Feed:
    def __init__(self) -> None:
        self.listeners: set[asyncio.Queue[dict[str, Any] | None]] = set()
        self.task: asyncio.Task[None] | None = None
        self.reads = 0


class Broadcaster:
    def __init__(self, pool: ConnectionPool, interval_s: float = 1.0) -> None:
        self.pool = pool
        self.interval_s = interval_s
        self.feeds: dict[int, _Feed] = {}
        self.running = 0  # poll loops running now (one per watched campaign)

    def _read(self, campaign_id: int) -> dict[str, Any]:
        with self.pool.connection() as conn:
            return progress_frame(status_view(conn, campaign_id), time.time())

    async def first_frame(self, campaign_id: int) -> dict[str, Any]:
        """NotFound before a stream opens for an unknown campaign."""
        return await asyncio.to_thread(self._read, campaign_id)

    async def _poll(self, campaign_id: int, feed: _Feed) -> None:
        self.running += 1
        try:
            await self._poll_loop(campaign_id, feed)
        finally:
            self.running -= 1

    async def _poll_loop(self, campaign_id: int, feed: _Feed) -> None:
        while feed.listeners:
            began = time.monotonic()
            try:
                frame = await asyncio.to_thread(self._read, campaign_id)
                feed.reads += 1
            except NotFound:
                frame = None
            except Exception:  # the database is away: listeners keep waiting
                log.warning("campaign %s: progress read failed", campaign_id, exc_info=True)
                await asyncio.sleep(self.interval_s)
                continue
            for queue in list(feed.listeners):
                if queue.full():
                    queue.get_nowait()
                queue.put_nowait(frame)
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - began)))

    async def listen(self, campaign_id: int) -> AsyncIterator[dict[str, Any] | None]:
        feed = self.feeds.get(campaign_id)
        if feed is None:
            feed = self.feeds[campaign_id] = _Feed()
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=1)
        feed.listeners.add(queue)
        if feed.task is None or feed.task.done():
            feed.task = asyncio.create_task(self._poll(campaign_id, feed))
        try:
            while True:
                yield await queue.get()
        finally:
            feed.listeners.discard(queue)
            if not feed.listeners:
                if feed.task is not None:
                    feed.task.cancel()
                self.feeds.pop(campaign_id, None)

    def pollers(self) -> int:
        """Poll loops running now: one per campaign someone listens to."""
        return self.running


def sse(frame: dict[str, Any] | None, event: str = "progress") -> bytes:
    if frame is None:
        return b"event: gone\ndata: {}\n\n"
    return f"event: {event}\ndata: {json.dumps(frame, default=str)}\n\n".encode()


KEY_RECHECK_S = 5.0  # how often an open stream asks whether its key is still usable


async def stream(
    broadcaster: Broadcaster,
    campaign_id: int,
    first: dict[str, Any],
    key_usable: Callable[[], bool],
) -> AsyncIterator[bytes]:
    """The stream's bytes: the frame read at open, then one per poll until the campaign is
    final (its last frame sent) or gone, or the key is revoked or expires (`key_usable`,
    asked every KEY_RECHECK_S)."""
    yield b"retry: 2000\n\n" + sse(first)
    if first.get("status") in FINAL:
        return
    checked = time.monotonic()
    async for frame in broadcaster.listen(campaign_id):
        if time.monotonic() - checked >= KEY_RECHECK_S:
            checked = time.monotonic()
            if not await asyncio.to_thread(key_usable):
                yield b"event: unauthorized\ndata: {}\n\n"
                return
        yield sse(frame)
        if frame is None or frame.get("status") in FINAL:
            return
