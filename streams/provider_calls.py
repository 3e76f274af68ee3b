"""The calls of a channel that sends one request per message (SMS, push): a provider client
built once, by the first thread that needs it; at most `inflight` requests at a time, each in
an executor thread, which also reads the moment of its answer."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

C = TypeVar("C")
A = TypeVar("A")
R = TypeVar("R")


class ProviderCalls(Generic[C]):
    def __init__(
        self, client: C | Callable[[], C], kind: type[C], *, inflight: int, name: str
    ) -> None:
        # A factory is called at the first request: a worker that never sends on this channel
        # never loads the service's model nor opens its connections.
        self._client: C | None = client if isinstance(client, kind) else None
        self._make: Callable[[], C] | None = None if isinstance(client, kind) else client  # type: ignore[assignment]
        self._making = threading.Lock()
        self._executor = ThreadPoolExecutor(max_workers=inflight, thread_name_prefix=name)
        self.slots = asyncio.Semaphore(inflight)

    def client(self) -> C:
        if self._client is None:
            # Once, by the first thread: every executor thread at a fresh worker's first calls
            # would otherwise build a client of its own, each loading the service's model
            # under the GIL (16 at once took 1.8 s on an idle machine), while the rows of
            # those calls are in a call and their lease runs.
            with self._making:
                if self._client is None:
                    assert self._make is not None
                    self._client = self._make()
        return self._client

    async def call(self, request: Callable[[C, A], R], argument: A) -> tuple[R, float]:
        """`request(client, argument)` in an executor thread; (its answer, when it came). The
        moment is read in that thread (see the sender's `_timed_send_bulk`: the hop back to a
        busy loop must not shorten the pacing window)."""

        def timed() -> tuple[R, float]:
            answer = request(self.client(), argument)
            return answer, time.monotonic()

        return await asyncio.get_running_loop().run_in_executor(self._executor, timed)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


async def wait_until(not_before: float) -> None:
    """Sleeps until the monotonic clock reaches `not_before` (a lane's paced start)."""
    while (wait := not_before - time.monotonic()) > 0:
        await asyncio.sleep(wait)
