"""How the bench computes its figures (flashsend/lab/bench_figures.py): measured, never clamped."""

from __future__ import annotations

import pytest

from flashsend.lab.bench_figures import (
    DEFAULT_SWEEP_RATES,
    clock_check,
    gate_share,
    limiter_figures,
    parse_rates,
    pause_latency,
    percentile,
    steady_state,
    summary,
    worst_ratio,
)
from flashsend.lab.limiter_sweep import series_bucket_ms


def test_default_sweep_covers_37_to_7777_with_non_round_rates() -> None:
    rates = DEFAULT_SWEEP_RATES
    assert len(rates) >= 8 and min(rates) == 37 and max(rates) == 7777
    assert sum(1 for r in rates if r % 100) >= 4


def test_steady_state_leaves_out_the_first_and_last_second() -> None:
    # 100/s for 10 s in 50-entry calls every 0.5 s, plus a burst of 400 at the start and a
    # straggler 50 at the end: neither is in the steady state.
    series = [(1000.0, 400)] + [(1000.0 + 0.5 * i, 50) for i in range(1, 21)] + [(1011.0, 50)]
    steady = steady_state(series)
    assert steady.first_ts == 1000.0 and steady.last_ts == 1011.0
    assert steady.seconds == pytest.approx(9.0)
    # Points at 1001.0, 1001.5, …, 1009.5 are in [1001, 1010): 18 calls.
    assert steady.recipients == 18 * 50
    assert steady.rate == pytest.approx(100.0)


def test_a_run_too_short_for_a_steady_state_has_no_rate() -> None:
    steady = steady_state([(5.0, 50), (6.5, 50)])
    assert steady.seconds < 0 and steady.rate is None
    assert steady_state([]).rate is None


def test_limiter_figures_report_overshoot_and_shortfall_as_measured() -> None:
    series = [(float(t) / 10, 12) for t in range(0, 101)]  # 120/s for 10 s
    row = limiter_figures(100.0, 150, series)
    assert row["ratio"] == 1.5  # over the limit: reported, not capped
    assert row["avg_ratio"] == pytest.approx(1.2)
    assert limiter_figures(100.0, None, [])["ratio"] is None


def test_worst_ratio_is_the_largest_measured() -> None:
    rows = [{"ratio": 0.98}, {"ratio": 1.21}, {"ratio": None}, {"ratio": 1.05}]
    assert worst_ratio(rows) == 1.21
    assert worst_ratio([{"ratio": None}]) is None


def test_pause_latency_keeps_its_sign() -> None:
    # Requested at 100.0, the command returned at 100.6, the last entry was accepted at 100.2.
    got = pause_latency(100.0, 100.6, 100.2)
    assert got["from_return_ms"] == pytest.approx(-400.0)
    assert got["from_request_ms"] == pytest.approx(200.0)
    assert pause_latency(100.0, 100.6, None) == {"from_return_ms": None, "from_request_ms": None}


def test_summary_is_signed_and_empty_is_none() -> None:
    assert summary([-5.0, 3.0, 40.0]) == {
        "median": 3.0,
        "max": 40.0,
        "samples": 3,
        "all": [-5.0, 3.0, 40.0],
    }
    assert summary([], listed=False) == {"median": None, "max": None, "samples": 0}


def test_clock_check_flags_an_offset_outside_the_bracket() -> None:
    same = clock_check(before=10.000, standin_now=10.001, after=10.002)
    assert same.offset_ms == pytest.approx(0.0) and not same.problem
    skewed = clock_check(before=10.000, standin_now=10.300, after=10.002)
    assert skewed.offset_ms == pytest.approx(299.0) and skewed.problem


def test_parse_rates() -> None:
    assert parse_rates("37, 120,7777") == [37.0, 120.0, 7777.0]
    for bad in ("", "37,x", "0", "-5", "nan"):
        with pytest.raises(ValueError):
            parse_rates(bad)


def test_percentile_is_a_measured_value_by_nearest_rank() -> None:
    lags = sorted([0.2, 0.1, 9.0, 0.3] + [0.5] * 96)
    assert percentile(lags, 99) == 0.5  # rank 99 of 100
    assert percentile(lags, 100) == 9.0
    assert percentile(lags, 50) == 0.5
    assert percentile([4.0], 99) == 4.0
    assert percentile([], 99) is None
    assert percentile([1.0, 2.0], 50) == 1.0  # never 1.5: no interpolation


def test_a_long_sweep_run_asks_the_stand_in_for_coarser_buckets() -> None:
    assert series_bucket_ms(6.0) == 1
    assert series_bucket_ms(50.0) == 1
    for span_s in (50.001, 120.0, 3_600.0):  # the stand-in answers at most 100,000 buckets
        assert span_s * 1000 / series_bucket_ms(span_s) <= 50_000


def test_gate_share_counts_each_closed_sample_until_the_next() -> None:
    samples = [(10.0, False), (10.5, True), (11.0, True), (12.5, False), (14.0, False)]
    share = gate_share(samples)
    assert (share.closed_s, share.sampled_s) == (2.0, 4.0)
    assert share.as_dict() == {"closed_s": 2.0, "sampled_s": 4.0, "closed_share": 0.5}


def test_gate_share_without_a_span_is_none_not_zero() -> None:
    assert gate_share([]).share is None
    assert gate_share([(3.0, True)]).as_dict()["closed_share"] is None
