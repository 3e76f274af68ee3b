"""Liveness and readiness of a long-running process, for a scheduler's probes.

- alive (`/healthz`): the process's own loop has ticked within `stale_s`. A wedged event loop,
  a deadlock or a call blocked for good stops the ticks, and a scheduler that restarts
  processes failing this probe recovers them. Nothing outside the process is asked: a
  PostgreSQL outage must not restart every worker at once (they wait it out).
- ready (`/readyz`): the role's start-up steps are done (a worker has joined its consumer group
  and taken its first assignment; a webhook listens) and its stores answer now (PostgreSQL
  and the Kafka brokers, each checked with a short timeout and cached for a few seconds).

The state is written by the process's loop and read by the HTTP thread that serves the
probes beside /metrics (`flashsend.metrics.serve`); each field is one attribute store, which
the two threads may interleave freely. `Probe` is pure: time comes in as `now`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_STALE_S = 60.0  # above the longest legitimate pause of a loop (a relay's 30-s backoff cap)
STORE_TTL_S = 5.0
BEAT_INTERVAL_S = 1.0
ASSIGNED = "assigned"  # a consumer's start-up step: joined its group, first seek done
# Paths on the metrics port (flashsend.metrics); deploy/kubernetes and its test use these.
LIVENESS_PATH = "/healthz"
READINESS_PATH = "/readyz"

StoreCheck = Callable[[], None]  # raises when the store does not answer


@dataclass
class Probe:
    stale_s: float = DEFAULT_STALE_S
    store_ttl_s: float = STORE_TTL_S
    _beat_at: float | None = None
    _pending: set[str] = field(default_factory=set)
    _done: set[str] = field(default_factory=set)
    _stores: dict[str, StoreCheck] = field(default_factory=dict)
    _store_results: dict[str, tuple[float, str | None]] = field(default_factory=dict)

    def beat(self, now: float) -> None:
        self._beat_at = now

    def expect(self, *steps: str) -> None:
        """Start-up steps that must be `done` before the process is ready (a step already
        done stays done: the order of the two calls does not matter)."""
        self._pending.update(set(steps) - self._done)

    def done(self, step: str) -> None:
        self._done.add(step)
        self._pending.discard(step)

    def store(self, name: str, check: StoreCheck) -> None:
        self._stores[name] = check

    def alive(self, now: float) -> tuple[bool, str]:
        if self._beat_at is None:
            return False, "starting: the loop has not ticked yet"
        age = now - self._beat_at
        if age > self.stale_s:
            return False, f"the loop last ticked {age:.1f}s ago (limit {self.stale_s:g}s)"
        return True, f"the loop ticked {age:.1f}s ago"

    def ready(self, now: float) -> tuple[bool, str]:
        alive, why = self.alive(now)
        if not alive:
            return False, why
        if self._pending:
            return False, "waiting for: " + ", ".join(sorted(self._pending))
        failed = [f"{name}: {error}" for name, error in self._check_stores(now) if error]
        if failed:
            return False, "; ".join(failed)
        return True, "ready"

    def _check_stores(self, now: float) -> list[tuple[str, str | None]]:
        out: list[tuple[str, str | None]] = []
        for name, check in self._stores.items():
            cached = self._store_results.get(name)
            if cached is None or now - cached[0] >= self.store_ttl_s:
                try:
                    check()
                    error = None
                except Exception as exc:  # any failure of a store check means "not ready"
                    error = str(exc) or type(exc).__name__
                cached = (now, error)
                self._store_results[name] = cached
            out.append((name, cached[1]))
        return out


PROBE = Probe()  # the process's own


async def heartbeat(probe: Probe = PROBE, interval_s: float = BEAT_INTERVAL_S) -> None:
    """Tick from the event loop: a loop that stops running its tasks stops the ticks."""
    while True:
        probe.beat(time.monotonic())
        await asyncio.sleep(interval_s)


_heartbeat_task: asyncio.Task[None] | None = None


def start_heartbeat() -> None:
    """Start the process's heartbeat on the running loop (once)."""
    global _heartbeat_task
    if _heartbeat_task is None or _heartbeat_task.done():
        _heartbeat_task = asyncio.get_running_loop().create_task(heartbeat(), name="heartbeat")


def stop_heartbeat() -> None:
    global _heartbeat_task
    if _heartbeat_task is not None:
        with contextlib.suppress(RuntimeError):
            _heartbeat_task.cancel()
        _heartbeat_task = None
