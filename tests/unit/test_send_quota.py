"""The 24-hour quota verdict: what a start needs against what SES has left, less what the
other live campaigns still hold."""

from __future__ import annotations

import pytest

from producers.send_quota import DailyQuota, verdict


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
