"""How `flashsend bench` turns raw observations into its figures (pure: no I/O, no clock).

Every figure is reported as measured: nothing is clamped or rounded towards a target. Where a
measurement cannot be made (too short a run, no sample) the figure is None, never 0.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# Awkward rates on purpose: a limiter can be exact at round rates and not between them.
DEFAULT_SWEEP_RATES = (37.0, 120.0, 777.0, 1234.0, 2222.0, 3120.0, 4000.0, 7777.0)
DEFAULT_SWEEP_SECONDS = 6.0
# A limiter run's steady state leaves out its first and last second: the first holds the
# start of 12 lanes at once, the last the partitions that finish before the others.
STEADY_TRIM_S = 1.0
# The stand-in is on the same host: its clock can only differ from ours by the time its
# answer took, plus this much scheduling noise.
CLOCK_TOLERANCE_MS = 5.0


def percentile(sorted_values: Sequence[float], pct: float) -> float | None:
    """Nearest-rank percentile of already sorted values (a value that was measured, never an
    interpolation between two); None when there is none."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summary(
    values: Sequence[float], *, listed: bool = True
) -> dict[str, float | int | list[float] | None]:
    """Median, max, how many and (if `listed`) every value, signed as measured; median and
    max are None when there is no value."""
    out: dict[str, float | int | list[float] | None] = {
        "median": round(statistics.median(values), 1) if values else None,
        "max": round(max(values), 1) if values else None,
        "samples": len(values),
    }
    if listed:
        out["all"] = [round(v, 1) for v in values]
    return out


@dataclass(frozen=True)
class Steady:
    """What the stand-in accepted in a run's steady state."""

    recipients: int  # accepted in [first + trim, last - trim)
    seconds: float  # that window's length; <= 0 when the run was too short to have one
    first_ts: float | None
    last_ts: float | None

    @property
    def rate(self) -> float | None:
        return self.recipients / self.seconds if self.seconds > 0 else None


def steady_state(series: Sequence[tuple[float, int]], trim_s: float = STEADY_TRIM_S) -> Steady:
    """The steady state of a run from the stand-in's acceptances ((time, recipients) in time
    order): the window from the first accepted entry + `trim_s` to the last accepted entry -
    `trim_s`, half-open. A run no longer than 2 x trim_s has no steady state (seconds <= 0)."""
    points = [(t, n) for t, n in series if n > 0]
    if not points:
        return Steady(0, 0.0, None, None)
    first, last = points[0][0], points[-1][0]
    start, end = first + trim_s, last - trim_s
    inside = sum(n for t, n in points if start <= t < end)
    return Steady(inside, end - start, first, last)


@dataclass(frozen=True)
class GateShare:
    closed_s: float
    sampled_s: float

    @property
    def share(self) -> float | None:
        return self.closed_s / self.sampled_s if self.sampled_s > 0 else None

    def as_dict(self) -> dict[str, float | None]:
        share = self.share
        return {
            "closed_s": round(self.closed_s, 2),
            "sampled_s": round(self.sampled_s, 2),
            "closed_share": None if share is None else round(share, 4),
        }


def gate_share(samples: Sequence[tuple[float, bool]]) -> GateShare:
    """How long the feedback gate was closed, from (time, closed) samples in time order: each
    sample's state holds until the next sample; the last sample ends the span."""
    closed = sum(b[0] - a[0] for a, b in itertools.pairwise(samples) if a[1])
    span = samples[-1][0] - samples[0][0] if samples else 0.0
    return GateShare(closed, span)


def limiter_figures(
    rate: float, max_1s_window: int | None, series: Sequence[tuple[float, int]]
) -> dict[str, float | int | None]:
    """One row of `limiter_sweep`: the busiest sliding second and the steady-state average,
    each against the limit."""
    steady = steady_state(series)
    steady_rate = steady.rate
    return {
        "rate": rate,
        "max_1s_window": max_1s_window,
        "ratio": None if max_1s_window is None else round(max_1s_window / rate, 3),
        "avg_ratio": None if steady_rate is None else round(steady_rate / rate, 3),
        "steady_rate_per_s": None if steady_rate is None else round(steady_rate, 1),
        "steady_s": round(steady.seconds, 2),
    }


def worst_ratio(rows: Sequence[dict[str, float | int | None]]) -> float | None:
    ratios = [float(r["ratio"]) for r in rows if r.get("ratio") is not None]  # type: ignore[arg-type]
    return max(ratios) if ratios else None


@dataclass(frozen=True)
class ClockCheck:
    """The stand-in's clock against ours, read between `before` and `after` (our clock)."""

    offset_ms: float  # stand-in minus the middle of our bracket
    uncertainty_ms: float  # half the bracket: the answer was made somewhere inside it

    @property
    def problem(self) -> bool:
        return abs(self.offset_ms) > self.uncertainty_ms + CLOCK_TOLERANCE_MS


def clock_check(before: float, standin_now: float, after: float) -> ClockCheck:
    middle = (before + after) / 2
    return ClockCheck(round((standin_now - middle) * 1000, 2), round((after - before) * 500, 2))


def pause_latency(
    requested: float, returned: float, last_accepted: float | None
) -> dict[str, float | None]:
    """One pause: from the moment the pause command returned (and from the moment it was
    called) to the last entry the stand-in accepted for the campaign. Negative from `returned`:
    the last entry went before the command returned (it waits for the workers' poll interval).
    Negative from `requested`: nothing was accepted after the pause was asked for."""
    if last_accepted is None:
        return {"from_return_ms": None, "from_request_ms": None}
    return {
        "from_return_ms": round((last_accepted - returned) * 1000, 1),
        "from_request_ms": round((last_accepted - requested) * 1000, 1),
    }


def parse_rates(text: str) -> list[float]:
    """`--sweep-rates 37,120,777`: positive rates, in the order given."""
    rates = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            rate = float(part)
        except ValueError:
            raise ValueError(f"not a rate: {part!r} (expected numbers like 37,120,777)") from None
        if not math.isfinite(rate) or rate <= 0:
            raise ValueError(f"a limiter rate must be a positive number of recipients/s: {part}")
        rates.append(rate)
    if not rates:
        raise ValueError("no rate given (expected numbers like 37,120,777)")
    return rates
