"""Sending limits as SES applies them: per-recipient rate and rolling 24-hour quota (pure).

Both count *recipients*, not calls (SES: "an email that has 10 recipients counts as 10").
Nothing here reads the clock; callers pass `now` (epoch seconds).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

DAY_S = 86_400.0


@dataclass(frozen=True, slots=True)
class TokenBucket:
    """MaxSendRate as a token bucket holding at most one second's worth of recipients.

    `rate <= 0` means unlimited. A call needing more tokens than are available is refused
    whole (SES answers 429 and accepts nothing); refused calls consume nothing.
    """

    rate: float
    tokens: float
    updated: float

    @classmethod
    def full(cls, rate: float, now: float) -> TokenBucket:
        return cls(rate=rate, tokens=max(rate, 0.0), updated=now)

    @property
    def unlimited(self) -> bool:
        return self.rate <= 0

    def available(self, now: float) -> float:
        """Tokens available at `now` (refilled at `rate`/s up to `rate`)."""
        if self.unlimited:
            return float("inf")
        elapsed = max(0.0, now - self.updated)
        return min(self.rate, self.tokens + elapsed * self.rate)

    def take(self, count: int, now: float) -> tuple[bool, TokenBucket]:
        """Try to take `count` tokens: (granted, new bucket).

        If the clock stepped back (`now < updated`) nothing refills and the bucket is rebased
        on `now`, so a clock step never stalls sending.
        """
        if self.unlimited:
            return True, self
        tokens = self.available(now)
        if count > tokens:
            return False, replace(self, tokens=tokens, updated=now)
        return True, replace(self, tokens=tokens - count, updated=now)


class RollingCounter:
    """Recipients accepted in the last `window_s` seconds (SentLast24Hours).

    Holds one (time, count) pair per accepted call; pruned lazily on read.
    """

    def __init__(self, window_s: float = DAY_S) -> None:
        self.window_s = window_s
        self._events: deque[tuple[float, int]] = deque()
        self._total = 0

    def add(self, t: float, count: int) -> None:
        if count <= 0:
            return
        if self._events and self._events[-1][0] == t:
            last_t, last_count = self._events.pop()
            self._events.append((last_t, last_count + count))
        else:
            self._events.append((t, count))
        self._total += count

    def total(self, now: float) -> int:
        cutoff = now - self.window_s
        events = self._events
        while events and events[0][0] <= cutoff:
            self._total -= events.popleft()[1]
        return self._total

    def clear(self) -> None:
        self._events.clear()
        self._total = 0


def quota_left(max_24h_send: float, sent_last_24h: int) -> float:
    """Recipients still allowed today; `max_24h_send <= 0` (SES uses -1) means unlimited."""
    if max_24h_send <= 0:
        return float("inf")
    return max(0.0, max_24h_send - sent_last_24h)
