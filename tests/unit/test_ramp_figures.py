"""The demo's and the tests' per-step figures: the busiest second wholly inside each step."""

from __future__ import annotations

from flashsend.lab.ramp_figures import bucket_ms, sliding_windows, step_windows
from streams.rules.ramp import parse_ramp


def test_sliding_windows_start_at_points_and_are_half_open() -> None:
    points = [(0.0, 5), (0.5, 5), (0.999, 5), (1.0, 7)]
    assert sliding_windows(points) == [(0.0, 15), (0.5, 17), (0.999, 12), (1.0, 7)]


def test_each_step_is_measured_inside_it_and_a_step_down_after_a_second() -> None:
    since = 1000.0
    # 100/s-ish for 3 s, then 300 in one second just after the step at 3 s.
    points = [(since + i * 0.1, 10) for i in range(30)] + [
        (since + 3.0 + i * 0.01, 3) for i in range(100)
    ]
    up = step_windows(points, since, parse_ramp("0:100,3s:300"))
    assert [s["max_1s_window"] for s in up] == [100, 300]
    down = step_windows(points, since, parse_ramp("0:300,3s:100"))
    assert down[0]["max_1s_window"] == 100
    assert down[1]["max_1s_window"] is None  # nothing sent a second after the step down


def test_bucket_fits_the_standin_limit() -> None:
    assert bucket_ms(10) == 1
    assert bucket_ms(1800) == 19
