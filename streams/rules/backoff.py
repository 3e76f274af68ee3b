"""Retry delays: exponential backoff with full jitter.

Why full jitter: after a throttle or a broker hiccup many senders fail at the same instant. With
plain exponential backoff they all come back at the same instants too and hit SES (or Postgres)
in synchronised waves. Drawing the delay uniformly from [0, min(cap, base * 2**(attempt-1)))
spreads them out; in AWS's published comparison of jitter schemes it needed about the fewest
calls in total for competing clients. The price is sometimes retrying almost at once, which is
harmless here because every retry goes through the rate limiter anyway.

Why pure: the random source is injected (`random.Random`) and time is passed in, so tests are
deterministic with a seeded generator and callers decide how to wait (asyncio sleep, a
`send_after` column, a lease).

Attempts are counted from 1: attempt 1 is the first *retry* after the first failure, so its
delay is drawn from [0, base).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

# 2**62 * any sane base is far above any cap; clamping the exponent avoids float overflow for
# absurd attempt numbers instead of raising deep inside a retry loop.
_MAX_EXPONENT = 62


def backoff_ceiling(attempt: int, *, base: float, cap: float) -> float:
    """Upper bound of the delay for `attempt`: min(cap, base * 2**(attempt-1))."""
    if attempt < 1:
        raise ValueError(f"attempt starts at 1, got {attempt}")
    if base < 0 or cap < 0:
        raise ValueError(f"base and cap must be >= 0, got base={base} cap={cap}")
    exponent = min(attempt - 1, _MAX_EXPONENT)
    return min(cap, base * float(2**exponent))


def backoff_delay(attempt: int, *, base: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait before retry number `attempt` (1-based): uniform in [0, ceiling)."""
    return backoff_ceiling(attempt, base=base, cap=cap) * rng.random()


def retry_schedule(
    max_attempts: int, *, base: float, cap: float, rng: random.Random
) -> list[float]:
    """The delays before retries 1..max_attempts, drawn in order from `rng`."""
    if max_attempts < 0:
        raise ValueError(f"max_attempts must be >= 0, got {max_attempts}")
    return [
        backoff_delay(attempt, base=base, cap=cap, rng=rng)
        for attempt in range(1, max_attempts + 1)
    ]


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently to retry one kind of failure.

    `max_attempts` counts retries (not the first try): 0 disables retrying. Settings build one
    of these per use (transactional send, SES throttle, Postgres reconnect) and pass it down.
    """

    max_attempts: int
    base: float = 0.5
    cap: float = 60.0

    def __post_init__(self) -> None:
        if self.max_attempts < 0:
            raise ValueError(f"max_attempts must be >= 0, got {self.max_attempts}")
        if self.base < 0 or self.cap < 0:
            raise ValueError(f"base and cap must be >= 0, got base={self.base} cap={self.cap}")

    def should_retry(self, attempt: int) -> bool:
        """True while retry number `attempt` (1-based) is still allowed."""
        return 1 <= attempt <= self.max_attempts

    def delay(self, attempt: int, rng: random.Random) -> float:
        return backoff_delay(attempt, base=self.base, cap=self.cap, rng=rng)

    def next_attempt_at(self, attempt: int, now: float, rng: random.Random) -> float | None:
        """When retry `attempt` may run (`now` + delay), or None when retries are exhausted.

        None is the caller's cue to give up: mark the row failed, or send the message to the
        DLQ. `now` may be wall-clock seconds (for a `send_after` column) or monotonic seconds
        (for an in-process sleep); the result is on the same clock.
        """
        if not self.should_retry(attempt):
            return None
        return now + self.delay(attempt, rng)
