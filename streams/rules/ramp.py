"""A campaign's rate ramp for a warming domain: `--ramp "0:200,10m:600,30m:1200"` is a step
function of the campaign's sending time (200/s from the start, 600/s after ten minutes of
sending, 1,200/s after thirty); the last step holds.

Why steps, not a line between the points: each step is a rate that holds for a stretch of
time, so what the limiter promises (no sliding second above the rate, within its slack) is a
promise about a number the operator wrote and can check at SES, and a lane's integer budget
changes a handful of times instead of every poll.

Why sending time, not wall-clock time since the start: a warming domain cares about the
volume it actually sent, so time spent paused (or held before a release) does not move the
ramp on; a paused campaign resumes at the step it was paused in. The sending time is kept by
the database (the `campaigns` row's `sending_s` and `sending_since`, migration 0024), so
every worker reads the same figure from one clock.

The ramp caps the campaign's rate_limit, it does not replace it: the effective rate is the
lower of the two (0 = unlimited for rate_limit; a ramp step is always > 0).

Pure: time comes in as numbers, nothing reads a clock.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flashsend.errors import UsageError
from streams.rules.ab_test import VariantError, parse_duration


class RampError(UsageError):
    """The ramp cannot be used."""


@dataclass(frozen=True)
class RampStep:
    at_s: float  # seconds of sending after which this rate applies
    rate: float  # recipients per second for the whole campaign

    def to_dict(self) -> dict[str, float]:
        return {"at_s": self.at_s, "rate": self.rate}


@dataclass(frozen=True)
class RampPosition:
    """Where a ramp stands after `elapsed_s` seconds of sending (what `campaign status` shows)."""

    step: int  # 1-based
    steps: int
    rate: float
    next_rate: float | None  # None once the last step holds
    next_in_s: float | None  # seconds of sending until the next step

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "steps": self.steps,
            "rate": self.rate,
            "next_rate": self.next_rate,
            "next_in_s": None if self.next_in_s is None else round(self.next_in_s, 1),
        }


def parse_ramp(text: str) -> tuple[RampStep, ...]:
    """`"0:200,10m:600,30m:1200"` → steps. Offsets use the duration syntax of `--holdout-wait`
    (90, 45s, 10m, 1h30m); the first must be 0, offsets strictly increase, rates are > 0."""
    steps: list[RampStep] = []
    for part in text.split(","):
        item = part.strip()
        at, sep, rate = item.partition(":")
        if not sep or not at.strip() or not rate.strip():
            raise RampError(
                f'ramp step {item!r}: use OFFSET:RATE, e.g. --ramp "0:200,10m:600,30m:1200"'
            )
        try:
            at_s = parse_duration(at)
        except VariantError as exc:
            raise RampError(f"ramp step {item!r}: {exc}") from None
        try:
            value = float(rate)
        except ValueError:
            raise RampError(f"ramp step {item!r}: rate {rate.strip()!r} is not a number") from None
        steps.append(RampStep(at_s, value))
    return check_ramp(steps)


def check_ramp(steps: Iterable[RampStep]) -> tuple[RampStep, ...]:
    checked = tuple(steps)
    if not checked:
        raise RampError("a ramp needs at least one step")
    if checked[0].at_s != 0:
        raise RampError(f"the ramp's first step must start at 0 (got {checked[0].at_s:g}s)")
    for before, after in itertools.pairwise(checked):
        if after.at_s <= before.at_s:
            raise RampError(
                f"ramp offsets must increase: {after.at_s:g}s comes after {before.at_s:g}s"
            )
    for step in checked:
        if not step.rate > 0 or step.rate == float("inf"):
            raise RampError(f"ramp rate {step.rate:g}/s at {step.at_s:g}s must be a number > 0")
    return checked


def ramp_from_rows(rows: Sequence[Mapping[str, Any]] | None) -> tuple[RampStep, ...]:
    """Steps as stored in `campaigns.ramp` (a JSON list of {at_s, rate}); () for no ramp."""
    if not rows:
        return ()
    return tuple(RampStep(float(r["at_s"]), float(r["rate"])) for r in rows)


def format_ramp(steps: Sequence[RampStep]) -> str:
    """The `--ramp` spelling of `steps` (offsets in seconds)."""
    return ",".join(f"{s.at_s:g}s:{s.rate:g}" for s in steps)


def position(steps: Sequence[RampStep], elapsed_s: float) -> RampPosition:
    """The step in force after `elapsed_s` seconds of sending, and the next change."""
    if not steps:
        raise ValueError("no ramp")
    index = 0
    for i, step in enumerate(steps):
        if step.at_s <= elapsed_s:
            index = i
    nxt = steps[index + 1] if index + 1 < len(steps) else None
    return RampPosition(
        step=index + 1,
        steps=len(steps),
        rate=steps[index].rate,
        next_rate=nxt.rate if nxt else None,
        next_in_s=max(0.0, nxt.at_s - elapsed_s) if nxt else None,
    )


def effective_rate(rate_limit: float, steps: Sequence[RampStep], elapsed_s: float) -> float:
    """The campaign's rate after `elapsed_s` seconds of sending: the ramp's step, capped by
    rate_limit (0 = unlimited, so the step alone); rate_limit itself without a ramp."""
    if not steps:
        return rate_limit
    step = position(steps, elapsed_s).rate
    return step if rate_limit <= 0 else min(rate_limit, step)


def sending_elapsed(elapsed_at_read: float, read_at: float, now: float, sending: bool) -> float:
    """Seconds of sending at `now`, from a figure read at `read_at` (same clock as `now`): it
    grows only while the campaign is sending, so a pause stops the ramp where it stands."""
    if not sending:
        return elapsed_at_read
    return elapsed_at_read + max(0.0, now - read_at)
