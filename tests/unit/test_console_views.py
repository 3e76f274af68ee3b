"""The console's pure helpers: numbers, times, thresholds, the chart, buttons by role."""

from __future__ import annotations

from datetime import UTC, datetime

from flashsend.api.console import views


def test_numbers_have_thousands_separators() -> None:
    assert views.number(1234567) == "1,234,567"
    assert views.number(0) == "0"
    assert views.number(1234.5) == "1,234.5"
    assert views.number(None) == "–"


def test_a_time_is_utc_in_the_text_and_on_hover_and_escaped() -> None:
    html = views.when(datetime(2026, 12, 7, 21, 5, tzinfo=UTC))
    assert 'title="2026-12-07 21:05:00 UTC"' in html and ">2026-12-07 21:05:00 UTC<" in html
    assert views.when(None) == "–"
    assert "<script" not in views.when("2026-12-07T21:05:00+00:00")


def test_feedback_rates_use_the_auto_pause_base() -> None:
    bounce, complaint = views.feedback_rates(
        {"sent": 1000, "delivered": 990, "bounced": 20, "complained": 2}, 0.001, 0.05
    )
    assert bounce.rate == 20 / 1010 and not bounce.over
    assert complaint.rate == 2 / 1010 and complaint.over
    assert all(t.rate == 0.0 for t in views.feedback_rates(None, 0.001, 0.05))


def test_a_viewer_gets_no_button_and_an_operator_gets_the_states_ones() -> None:
    assert views.actions("viewer", "sending") == ()
    assert views.actions("operator", "sending") == ("pause", "cancel")
    assert views.actions("admin", "paused") == ("resume", "cancel")
    assert views.actions("operator", "draft") == ("start",)
    assert views.actions("operator", "done") == ()


def test_chart_points_fill_the_box() -> None:
    points, top = views.chart_points([{"t_s": 0, "per_s": 50}, {"t_s": 10, "per_s": 100}])
    assert top == 100 and points == "0.0,80.0 600.0,0.0"
    assert views.chart_points([]) == ("", 0.0)


def test_eta_and_durations() -> None:
    assert views.eta_s({"pending": 900, "sending": 100}, 10.0) == 100.0
    assert views.eta_s({"pending": 0, "sending": 0}, 10.0) is None
    assert views.duration(3725) == "1 h 02 min" and views.duration(65) == "1 min 05 s"
