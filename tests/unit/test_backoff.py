"""Exponential backoff with full jitter."""

from __future__ import annotations

import random

import pytest

from streams.rules.backoff import RetryPolicy, backoff_ceiling, backoff_delay, retry_schedule


@pytest.mark.parametrize("attempt", range(1, 12))
def test_delay_stays_within_bounds(attempt: int) -> None:
    rng = random.Random(attempt)
    ceiling = min(30.0, 0.5 * 2 ** (attempt - 1))
    for _ in range(500):
        delay = backoff_delay(attempt, base=0.5, cap=30.0, rng=rng)
        assert 0.0 <= delay < ceiling


def test_ceiling_grows_exponentially_then_caps() -> None:
    ceilings = [backoff_ceiling(a, base=0.1, cap=3.0) for a in range(1, 8)]
    assert ceilings == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.0, 3.0])


def test_average_delay_grows_with_attempt_until_cap() -> None:
    rng = random.Random(1)

    def mean(attempt: int) -> float:
        return sum(backoff_delay(attempt, base=1.0, cap=16.0, rng=rng) for _ in range(4000)) / 4000

    means = [mean(a) for a in range(1, 8)]
    # full jitter: the mean is half the ceiling (1, 2, 4, 8, 16, 16, 16) / 2
    assert means == pytest.approx([0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0], rel=0.06)


def test_jitter_spreads_callers_that_failed_together() -> None:
    rng = random.Random(3)
    delays = [backoff_delay(4, base=1.0, cap=60.0, rng=rng) for _ in range(1000)]
    assert min(delays) < 0.5 and max(delays) > 7.5
    assert len({round(d, 3) for d in delays}) > 900


def test_huge_attempt_does_not_overflow() -> None:
    assert backoff_ceiling(10_000, base=0.5, cap=60.0) == 60.0
    assert 0.0 <= backoff_delay(10_000, base=0.5, cap=60.0, rng=random.Random(0)) < 60.0


def test_deterministic_with_seeded_rng() -> None:
    first = retry_schedule(6, base=0.2, cap=5.0, rng=random.Random(42))
    second = retry_schedule(6, base=0.2, cap=5.0, rng=random.Random(42))
    assert first == second
    assert len(first) == 6
    assert retry_schedule(0, base=0.2, cap=5.0, rng=random.Random(42)) == []


def test_zero_base_means_no_wait() -> None:
    assert backoff_delay(5, base=0.0, cap=10.0, rng=random.Random(0)) == 0.0


@pytest.mark.parametrize(
    ("attempt", "base", "cap"), [(0, 1.0, 1.0), (1, -1.0, 1.0), (1, 1.0, -1.0)]
)
def test_invalid_arguments(attempt: int, base: float, cap: float) -> None:
    with pytest.raises(ValueError):
        backoff_ceiling(attempt, base=base, cap=cap)


def test_retry_schedule_rejects_negative() -> None:
    with pytest.raises(ValueError):
        retry_schedule(-1, base=1.0, cap=1.0, rng=random.Random(0))


def test_policy_gives_up_after_max_attempts() -> None:
    policy = RetryPolicy(max_attempts=3, base=1.0, cap=10.0)
    rng = random.Random(5)
    assert [policy.should_retry(a) for a in range(0, 5)] == [False, True, True, True, False]
    at = policy.next_attempt_at(3, 100.0, rng)
    assert at is not None and 100.0 <= at < 104.0
    assert policy.next_attempt_at(4, 100.0, rng) is None
    assert RetryPolicy(max_attempts=0).next_attempt_at(1, 0.0, rng) is None


def test_policy_delay_matches_function() -> None:
    policy = RetryPolicy(max_attempts=5, base=0.25, cap=2.0)
    assert policy.delay(3, random.Random(9)) == backoff_delay(
        3, base=0.25, cap=2.0, rng=random.Random(9)
    )


def test_policy_validates() -> None:
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=-1)
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=1, base=-0.1)
