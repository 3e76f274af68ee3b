"""A ramp's figures at the SES stand-in: the busiest sliding second within each step.

Pure: the points are the stand-in's acceptances per bucket ((epoch s, recipients), from
`/_admin/rate`), `since` is when the campaign began sending (campaigns.sending_since).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from streams.rules.ramp import RampStep

# The stand-in answers at most 100,000 buckets; a finer bucket is a more exact window.
MAX_BUCKETS = 100_000


def bucket_ms(span_s: float) -> int:
    """The finest bucket (ms) that covers `span_s` seconds within MAX_BUCKETS."""
    return max(1, math.ceil(span_s * 1000 / (MAX_BUCKETS - 2)))


def sliding_windows(
    points: Sequence[tuple[float, int]], width_s: float = 1.0
) -> list[tuple[float, int]]:
    """(start, recipients) of every window [t, t + width_s) that starts at a point, in time
    order (a busiest window can always be slid to start at a point)."""
    out: list[tuple[float, int]] = []
    hi, total = 0, 0
    for lo, (t, _) in enumerate(points):
        while hi < len(points) and points[hi][0] < t + width_s - 1e-9:
            total += points[hi][1]
            hi += 1
        out.append((t, total))
        total -= points[lo][1]
    return out


def step_windows(
    points: Sequence[tuple[float, int]], since: float, steps: Sequence[RampStep]
) -> list[dict[str, Any]]:
    """Per step: its rate and the busiest second lying wholly within it. A step down is
    measured from a second after it begins (what the window already holds drains first)."""
    windows = sliding_windows(sorted((t, n) for t, n in points if n))
    out: list[dict[str, Any]] = []
    for i, step in enumerate(steps):
        settle = 1.0 if i and step.rate < steps[i - 1].rate else 0.0
        begin = since + step.at_s + settle
        end = since + steps[i + 1].at_s if i + 1 < len(steps) else math.inf
        inside = [n for t, n in windows if begin <= t and t + 1.0 <= end]
        out.append(
            {
                "at_s": step.at_s,
                "rate": step.rate,
                "max_1s_window": max(inside, default=None),
                "windows": len(inside),
            }
        )
    return out
