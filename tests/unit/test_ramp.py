"""The rate ramp as a pure function of sending time: steps, the last one holding, the cap of
the campaign's rate_limit, and a pause that stops the ramp where it stands."""

from __future__ import annotations

import pytest

from streams.rules.ramp import (
    RampError,
    RampStep,
    effective_rate,
    format_ramp,
    parse_ramp,
    position,
    ramp_from_rows,
    sending_elapsed,
)

RAMP = parse_ramp("0:200,10m:600,30m:1200")


def test_parse_uses_duration_offsets() -> None:
    expected = (RampStep(0, 200), RampStep(600, 600), RampStep(1800, 1200))
    assert expected == RAMP
    assert parse_ramp(" 0:100 , 3s:300 ") == (RampStep(0, 100), RampStep(3, 300))
    assert parse_ramp(format_ramp(RAMP)) == RAMP
    assert ramp_from_rows([s.to_dict() for s in RAMP]) == RAMP
    assert ramp_from_rows(None) == ()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "OFFSET:RATE"),
        ("200", "OFFSET:RATE"),
        ("5s:200", "must start at 0"),
        ("0:200,10m:600,5m:900", "must increase"),
        ("0:200,0:300", "must increase"),
        ("0:0", "> 0"),
        ("0:-5", "> 0"),
        ("0:fast", "not a number"),
        ("0:100,10x:200", "units"),
    ],
)
def test_bad_ramps_say_why(text: str, says: str) -> None:
    with pytest.raises(RampError, match=says):
        parse_ramp(text)


def test_steps_and_the_last_one_holds() -> None:
    assert [effective_rate(0, RAMP, t) for t in (0, 599.9, 600, 1799, 1800, 86400)] == [
        200,
        200,
        600,
        600,
        1200,
        1200,
    ]


def test_position_names_the_next_change() -> None:
    first = position(RAMP, 120)
    assert (first.step, first.steps, first.rate, first.next_rate) == (1, 3, 200, 600)
    assert first.next_in_s == pytest.approx(480)
    last = position(RAMP, 5000)
    assert (last.step, last.rate, last.next_rate, last.next_in_s) == (3, 1200, None, None)


def test_rate_limit_caps_the_ramp_and_no_ramp_is_the_rate_limit() -> None:
    assert effective_rate(500, RAMP, 0) == 200
    assert effective_rate(500, RAMP, 2000) == 500  # lowered with set-rate: the lower wins
    assert effective_rate(0, RAMP, 2000) == 1200  # unlimited: the step alone
    assert effective_rate(750, (), 2000) == 750
    assert effective_rate(0, (), 2000) == 0


def test_a_step_down_applies_at_its_offset() -> None:
    ramp = parse_ramp("0:300,10s:100")
    assert effective_rate(0, ramp, 9.99) == 300
    assert effective_rate(0, ramp, 10.0) == 100


def test_pause_stops_the_ramp_clock() -> None:
    # Read at monotonic 100 s: 590 s of sending so far.
    read_at, elapsed = 100.0, 590.0
    sending_now = sending_elapsed(elapsed, read_at, now=115.0, sending=True)
    assert sending_now == 605.0
    assert effective_rate(0, RAMP, sending_now) == 600
    # Paused when read: an hour later the ramp still stands where the pause left it.
    paused = sending_elapsed(elapsed, read_at, now=3700.0, sending=False)
    assert paused == 590.0
    assert effective_rate(0, RAMP, paused) == 200
    # A clock that steps back never moves the ramp backwards past the read.
    assert sending_elapsed(elapsed, read_at, now=99.0, sending=True) == 590.0
