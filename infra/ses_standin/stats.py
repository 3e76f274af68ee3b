"""Statistics over accepted recipients (pure).

Acceptances are kept as two parallel lists, `times` (epoch seconds, one per accepted call and
campaign) and `counts` (recipients accepted at that time). All entries of one call share the
call's acceptance time, so a 1,000,000-recipient campaign is ~20,000 points, not a million.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def sort_points(times: Sequence[float], counts: Sequence[int]) -> tuple[list[float], list[int]]:
    """Points ordered by time (the wall clock may step back; usually already sorted)."""
    if all(times[i] <= times[i + 1] for i in range(len(times) - 1)):
        return list(times), list(counts)
    order = sorted(range(len(times)), key=times.__getitem__)
    return [times[i] for i in order], [counts[i] for i in order]


def max_in_window(times: Sequence[float], counts: Sequence[int], width_s: float = 1.0) -> int:
    """Largest number of recipients accepted in any half-open window [t, t + width_s).

    Exact: two pointers over the sorted points. A window that maximises the sum can always be
    slid right until it starts at a point, so only windows starting at points are checked.
    """
    best = 0
    current = 0
    lo = 0
    for hi, t in enumerate(times):
        current += counts[hi]
        # Same float expression as the definition (t < start + width), not t - width.
        while times[lo] + width_s <= t:
            current -= counts[lo]
            lo += 1
        best = max(best, current)
    return best


def bucket_counts(
    times: Sequence[float], counts: Sequence[int], bucket_s: float, max_buckets: int = 100_000
) -> list[tuple[float, int]]:
    """Recipients per fixed bucket from the first to the last point, empty buckets included.

    Each row is (bucket start in epoch seconds, recipients). Raises ValueError when the span
    would need more than `max_buckets` rows.
    """
    if bucket_s <= 0:
        raise ValueError("bucket size must be positive")
    if not times:
        return []
    first = math.floor(min(times) / bucket_s)
    last = math.floor(max(times) / bucket_s)
    n_buckets = last - first + 1
    if n_buckets > max_buckets:
        raise ValueError(f"{n_buckets} buckets requested; the maximum is {max_buckets}")
    rows = [0] * n_buckets
    for t, count in zip(times, counts, strict=True):
        rows[math.floor(t / bucket_s) - first] += count
    return [(round((first + i) * bucket_s, 6), rows[i]) for i in range(n_buckets)]
