"""The 24-hour quota verdict: what a start needs against what SES has left, less what the
other live campaigns still hold."""

from __future__ import annotations

import pytest

from producers.send_quota import (
    DAY_S,
    SPREAD_MARGIN_S,
    DailyQuota,
    QuotaExceeded,
    spread_plan,
    verdict,
)


def test_fits_within_the_rest_of_the_quota() -> None:
    quota = DailyQuota(max_24h=20_000, sent_24h=5_000)
    assert verdict(15_000, 0, quota).fits
    assert not verdict(15_001, 0, quota).fits
    assert verdict(15_001, 0, quota).remaining == 15_000


def test_sent_last_24_hours_counts() -> None:
    fresh = DailyQuota(max_24h=20_000, sent_24h=0)
    used = DailyQuota(max_24h=20_000, sent_24h=19_000)
    assert verdict(10_000, 0, fresh).fits
    assert not verdict(10_000, 0, used).fits


def test_other_live_campaigns_hold_part_of_it() -> None:
    quota = DailyQuota(max_24h=20_000, sent_24h=5_000)
    v = verdict(10_000, 6_000, quota)
    assert v.remaining == 9_000
    assert not v.fits
    assert verdict(9_000, 6_000, quota).fits


def test_unlimited_always_fits() -> None:
    quota = DailyQuota.from_send_quota(
        {"Max24HourSend": -1.0, "MaxSendRate": -1.0, "SentLast24Hours": 7.0}
    )
    assert quota.unlimited
    assert verdict(10**9, 10**9, quota).fits


def test_over_used_quota_leaves_zero_not_negative() -> None:
    v = verdict(1, 50, DailyQuota(max_24h=100, sent_24h=90))
    assert v.remaining == 0
    assert not v.fits


def test_refusal_is_one_line_with_every_figure() -> None:
    v = verdict(12_345, 2_000, DailyQuota(max_24h=20_000, sent_24h=9_000))
    line = v.refusal()
    assert "\n" not in line
    for figure in ("12,345", "Max24HourSend 20,000", "SentLast24Hours 9,000", "2,000", "9,000"):
        assert figure in line
    assert "remaining 9,000" in line
    assert "--ignore-quota" in line and "--audience" in line and "later" in line


def test_negative_counts_are_a_bug() -> None:
    with pytest.raises(ValueError):
        verdict(-1, 0, DailyQuota(100, 0))


def test_a_spread_plan_sends_what_is_left_today_and_as_much_each_day_after() -> None:
    quota = DailyQuota(max_24h=20_000, sent_24h=5_000)
    plan = spread_plan(verdict(50_000, 3_000, quota), rate=100.0)
    assert plan.per_day == 12_000  # 20,000 - 5,000 - 3,000: other traffic assumed to recur
    assert plan.days == 5
    assert plan.counts() == [12_000, 12_000, 12_000, 12_000, 2_000]
    assert sum(plan.counts()) == 50_000


def test_a_day_starts_once_the_day_before_has_left_the_rolling_24_hours() -> None:
    # 12,000 at 100/s take 120 s: the next day starts 24 h + 120 s + the margin later.
    plan = spread_plan(verdict(50_000, 3_000, DailyQuota(20_000, 5_000)), rate=100.0)
    assert plan.period_s == DAY_S + 120 + SPREAD_MARGIN_S
    unlimited = spread_plan(verdict(50_000, 0, DailyQuota(20_000, 5_000)), rate=0.0)
    assert unlimited.period_s == DAY_S + SPREAD_MARGIN_S


def test_no_plan_when_nothing_is_left_today() -> None:
    with pytest.raises(QuotaExceeded, match="nothing is left of today's quota"):
        spread_plan(verdict(10, 0, DailyQuota(max_24h=1_000, sent_24h=1_000)), rate=10.0)
    with pytest.raises(QuotaExceeded):
        spread_plan(verdict(10, 400, DailyQuota(max_24h=1_000, sent_24h=600.5)), rate=10.0)
