"""A campaign's rate limit split over its partitions, fractions included.

Each lane (partition) holds an integer budget per sliding second, and the budgets of all lanes
sum to floor(limit) at every instant, so the limit holds with no shared counter. With integer
shares alone a lane whose fair share is 1.67/s gets 1 or 2 for the whole campaign: at 20/s over
12 partitions, the lanes with 2 finish in half the time and the campaign's second half runs at
a fraction of its limit.

So the fractions move: a lane's share is its integer part, plus 1 while a rotating pointer is
over its slice of the fractional parts. Lay the lanes' fractions end to end on a circle of
circumference 1 (in units of `unit`); m = the sum of the fractions pointers, one per unit,
turn once per `cycle_s` of sending; a lane gets its +1 while a pointer is over its slice. At
any instant exactly m lanes have it, and over a cycle each lane has it for its fraction of the
cycle, in one stretch: the plan's cycle is the campaign's planned duration (its recipients /
its limit, at least `MIN_CYCLE_S`), so every lane gets its exact share over the campaign and
the +1 changes hands about once per lane per campaign.

A +1 changing hands is the one unsafe moment: the lane losing it may have spent it in the
second before, so the lane gaining it waits: `budget_over` gives the least budget over an
interval of the sending clock, and a lane asks it over [now - hold, now + ahead], `hold`
covering the window, the call's latency to SES and the lanes' clock differences. Any two lanes
asking within `hold - ahead` of each other then see budgets that sum to at most floor(limit).

Time is the campaign's sending clock (`sending_elapsed`: seconds spent sending, paused time
left out), read by every worker from PostgreSQL, so all lanes agree where the pointers are.
Pure: nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Float sums of 1/rate drift by picoseconds; this much is noise.
_EPSILON = 1e-9
# A plan's cycle is never shorter: the +1 then changes hands at most ~partitions times in this
# many seconds, and each change idles a unit for a hold.
MIN_CYCLE_S = 20.0


@dataclass(frozen=True)
class SharePlan:
    """Per partition: `base` recipients per second, plus 1 while the pointer is over its slice
    [`start`, `start` + `rem`) of the circle of circumference `unit`."""

    limit: int
    unit: int
    base: tuple[int, ...]
    rem: tuple[int, ...]
    start: tuple[int, ...]
    cycle_s: float

    def budget_at(self, partition: int, clock: float) -> int:
        """The partition's budget at the sending clock `clock` (seconds)."""
        return self.budget_over(partition, clock, clock)

    def budget_over(self, partition: int, start: float, end: float) -> int:
        """The partition's least budget over the sending clock's interval [start, end]."""
        if self.limit <= 0:
            return 0
        base, rem = self.base[partition], self.rem[partition]
        if rem == 0:
            return base
        phase = (start / self.cycle_s) % 1.0 * self.unit
        sweep = max(0.0, end - start) / self.cycle_s * self.unit
        into = (phase - self.start[partition]) % self.unit  # from the slice's start
        return base + (1 if into + sweep < rem - _EPSILON * self.unit else 0)


def share_plan(rate: float, partitions: int, weights: Sequence[int] | None = None) -> SharePlan:
    """The plan for a campaign limited to `rate` recipients/s over `partitions`, in proportion
    to `weights` (its recipients per partition, so partitions that drew more users do not
    finish last; equal when None or not fitting). `rate` <= 0 is unlimited (budgets 0).

    A partition whose proportional share is under 1/s gets 1 (a lane needs a whole recipient
    to send at all) and the rest is split over the others; below one per partition every lane
    gets 1, so the bound there is `partitions` per second."""
    if partitions < 1:
        raise ValueError(f"partitions must be >= 1, got {partitions}")
    limit = math.floor(rate + _EPSILON) if rate > 0 else 0
    if limit <= 0:
        return SharePlan(0, 1, (0,) * partitions, (0,) * partitions, (0,) * partitions, 1.0)
    if weights is None or len(weights) != partitions or min(weights) < 0 or sum(weights) == 0:
        weights = [1] * partitions
    if limit <= partitions:
        ones = (1,) * partitions
        return SharePlan(limit, 1, ones, (0,) * partitions, (0,) * partitions, MIN_CYCLE_S)
    fixed = _fixed_at_one(limit, weights)
    free_limit = limit - len(fixed)
    unit = sum(w for p, w in enumerate(weights) if p not in fixed)
    base: list[int] = []
    rem: list[int] = []
    start: list[int] = []
    at = 0
    for p, w in enumerate(weights):
        if p in fixed:
            base.append(1)
            rem.append(0)
        else:
            base.append(free_limit * w // unit)
            rem.append(free_limit * w % unit)
        start.append(at % unit)
        at += rem[-1]
    cycle_s = max(MIN_CYCLE_S, sum(weights) / rate)
    return SharePlan(limit, unit, tuple(base), tuple(rem), tuple(start), cycle_s)


def _fixed_at_one(limit: int, weights: Sequence[int]) -> set[int]:
    """The partitions whose proportional share of what the others leave is under 1/s. The
    heaviest partition is never among them while limit > partitions."""
    fixed: set[int] = set()
    while True:
        free = [p for p in range(len(weights)) if p not in fixed]
        total = sum(weights[p] for p in free)
        under = {p for p in free if (limit - len(fixed)) * weights[p] < total}
        if not under:
            return fixed
        fixed |= under
