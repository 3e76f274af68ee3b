"""The local-time window and the engagement waves, planned with an injected clock."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest

from streams.rules.send_plan import (
    MAX_WAVE_SLOTS,
    PASSED,
    LocalWindow,
    Schedule,
    ScheduleError,
    Wave,
    check_schedule,
    is_recent,
    load_zone,
    parse_waves,
    parse_window,
    plan_waves,
    plan_zones,
    schedule_from_flags,
    sms_schedule,
    wave_send_after,
    window_send_after,
    window_slot,
)

# 07:30 UTC: 14:30 in Ho Chi Minh City (UTC+7), 08:30 in Paris (UTC+1), 02:30 in New York.
NOW = datetime(2026, 12, 4, 7, 30, tzinfo=UTC)
HCM, PARIS, NY = (
    ZoneInfo("Asia/Ho_Chi_Minh"),
    ZoneInfo("Europe/Paris"),
    ZoneInfo("America/New_York"),
)


def test_parse_window_and_date() -> None:
    w = parse_window("9:00-11:30", "2026-12-05")
    assert (w.start, w.end, w.date) == (time(9), time(11, 30), date(2026, 12, 5))
    assert LocalWindow.of(w.to_dict()) == w
    assert parse_window("09:00-11:00").date is None


@pytest.mark.parametrize(
    ("text", "day"),
    [
        ("9-11", None),
        ("11:00-09:00", None),
        ("09:00-09:00", None),
        ("24:00-25:00", None),
        ("09:00", None),
        ("09:00-11:00", "05/12/2026"),
    ],
)
def test_parse_window_refuses(text: str, day: str | None) -> None:
    with pytest.raises(ScheduleError):
        parse_window(text, day)


def test_window_with_date_before_inside_and_after() -> None:
    w = parse_window("09:00-11:00", "2026-12-04")
    # Paris is before its window: due at 09:00 Paris = 08:00 UTC.
    assert window_send_after(w, PARIS, NOW) == datetime(2026, 12, 4, 8, 0, tzinfo=UTC)
    # Inside the window: due now.
    assert window_send_after(w, PARIS, NOW + timedelta(hours=1)) == NOW + timedelta(hours=1)
    # New York: 09:00 EST = 14:00 UTC.
    assert window_send_after(w, NY, NOW) == datetime(2026, 12, 4, 14, 0, tzinfo=UTC)
    # Ho Chi Minh City's window of that date ended at 04:00 UTC: skipped.
    assert window_send_after(w, HCM, NOW) is None


def test_window_without_date_takes_the_next_window() -> None:
    w = parse_window("09:00-11:00")
    assert window_send_after(w, HCM, NOW) == datetime(2026, 12, 5, 2, 0, tzinfo=UTC)
    assert window_send_after(w, PARIS, NOW) == datetime(2026, 12, 4, 8, 0, tzinfo=UTC)
    # New York's local date is still 12-04 at 02:30: today's 09:00.
    assert window_send_after(w, NY, NOW) == datetime(2026, 12, 4, 14, 0, tzinfo=UTC)


def test_window_follows_daylight_saving() -> None:
    w = parse_window("09:00-11:00", "2026-07-01")
    assert window_send_after(w, PARIS, datetime(2026, 7, 1, tzinfo=UTC)) == datetime(
        2026, 7, 1, 7, 0, tzinfo=UTC
    )


def test_plan_zones_counts_unknown_names_and_uses_the_default() -> None:
    w = parse_window("09:00-11:00", "2026-12-04")
    plan = plan_zones(
        w,
        [("Europe/Paris", 5), ("Mars/Olympus", 3), (None, 7), ("Asia/Ho_Chi_Minh", 2), ("", 1)],
        "America/New_York",
        NOW,
    )
    ny = datetime(2026, 12, 4, 14, 0, tzinfo=UTC).isoformat()
    assert plan.names == ["", "Europe/Paris", "Mars/Olympus", "Asia/Ho_Chi_Minh"]
    assert plan.send_after == [ny, datetime(2026, 12, 4, 8, tzinfo=UTC).isoformat(), ny, PASSED]
    assert plan.unknown == {"Mars/Olympus": 3}


@pytest.mark.parametrize(
    "name",
    [
        "America",
        "../../etc/passwd",
        "/etc/localtime",
        "a" * 5000,
        "x\x00y",
        "Europe/Paris ",
        "europe/paris",
        "zone.tab",
    ],
)
def test_any_unknown_zone_name_falls_back_to_the_default(name: str) -> None:
    plan = plan_zones(parse_window("09:00-11:00", "2026-12-04"), [(name, 1)], "Europe/Paris", NOW)
    assert plan.send_after[1] == plan.send_after[0]
    assert plan.unknown == {name: 1}


def test_a_bad_default_zone_is_a_clear_error() -> None:
    with pytest.raises(ScheduleError, match="FLASHSEND_DEFAULT_TIMEZONE"):
        load_zone("Nowhere/Atall")
    with pytest.raises(ScheduleError):
        plan_zones(parse_window("09:00-10:00"), [], "Nowhere/Atall", NOW)


def test_parse_waves() -> None:
    waves = parse_waves("recent:30m, rest:2d")
    assert waves == (Wave("recent", 1800.0), Wave("rest", 172800.0))
    assert (waves[0].slots, waves[0].width_s) == (30, 60.0)
    assert (waves[1].slots, waves[1].width_s) == (MAX_WAVE_SLOTS, 1800.0)
    assert parse_waves("rest:0") == (Wave("rest", 0.0),)
    assert Wave("rest", 0.0).slots == 1
    assert Schedule.of(Schedule(waves=waves).to_dict()) == Schedule(waves=waves)


@pytest.mark.parametrize(
    "text",
    [
        "recent:30m",
        "rest:2d,recent:30m",
        "recent:30m,recent:1h,rest:1d",
        "vip:1h,rest:1d",
        "recent,rest:1d",
        "recent:soon,rest:1d",
        "",
    ],
)
def test_parse_waves_refuses(text: str) -> None:
    with pytest.raises(ScheduleError):
        parse_waves(text)


def test_wave_plan_spreads_each_wave_over_its_span() -> None:
    plan = plan_waves(parse_waves("recent:30m,rest:2d"), NOW, recent_days=30)
    assert plan.starts == [NOW, NOW + timedelta(minutes=30)]
    assert (plan.recent_wave, plan.rest_wave) == (1, 2)
    assert plan.recent_since == NOW - timedelta(days=30)
    # Every fifth user is recent: a pattern in the ids must not leave slots empty.
    recent = Counter(wave_send_after(plan, 7, uid, True) for uid in range(5, 15_001, 5))
    rest = Counter(wave_send_after(plan, 7, uid, False) for uid in range(1, 19_201))
    # Wave 1: 30 slots a minute apart from the start, ~100 users each.
    assert sorted(recent) == [NOW + timedelta(minutes=m) for m in range(30)]
    assert min(recent.values()) >= 60 and max(recent.values()) <= 140, recent
    # Wave 2 starts when wave 1 ends: 96 slots of 30 minutes over 2 days, ~200 users each.
    wave2 = NOW + timedelta(minutes=30)
    assert sorted(rest) == [wave2 + timedelta(minutes=30 * k) for k in range(MAX_WAVE_SLOTS)]
    assert min(rest.values()) >= 140 and max(rest.values()) <= 260, rest


def test_the_slot_hash_depends_on_the_campaign() -> None:
    plan = plan_waves(parse_waves("rest:1h"), NOW, recent_days=30)
    a = [wave_send_after(plan, 1, uid, False) for uid in range(1, 200)]
    b = [wave_send_after(plan, 2, uid, False) for uid in range(1, 200)]
    assert a != b


def test_without_a_recent_wave_everyone_is_in_rest() -> None:
    plan = plan_waves(parse_waves("rest:1h"), NOW, recent_days=30)
    assert (plan.recent_wave, plan.rest_wave) == (1, 1)
    assert wave_send_after(plan, 3, 7, True) == wave_send_after(plan, 3, 7, False)


def test_recent_means_an_open_or_click_since_the_cut_off() -> None:
    plan = plan_waves(parse_waves("recent:30m,rest:2d"), NOW, recent_days=30)
    old, fresh = NOW - timedelta(days=31), NOW - timedelta(days=2)
    assert is_recent(plan, fresh, None) and is_recent(plan, old, fresh)
    assert not is_recent(plan, old, None) and not is_recent(plan, None, None)


def test_schedule_combinations_refused() -> None:
    w = parse_window("09:00-11:00")
    with pytest.raises(ScheduleError):
        check_schedule(Schedule(window=w, waves=(Wave("rest", 60.0),)), has_variants=False, now=NOW)
    with pytest.raises(ScheduleError, match="A/B"):
        check_schedule(Schedule(window=w), has_variants=True, now=NOW)
    check_schedule(Schedule(window=w), has_variants=False, now=NOW)


def test_a_date_whose_window_ended_everywhere_is_refused() -> None:
    # 09:00-11:00 on 12-03 ends last at UTC-12: 12-03 23:00 UTC; NOW is 12-04 07:30 UTC.
    with pytest.raises(ScheduleError, match="every time zone"):
        check_schedule(
            Schedule(window=parse_window("09:00-11:00", "2026-12-03")), has_variants=False, now=NOW
        )
    # On 12-04 it is still 11:00-ish somewhere west: accepted (eastern zones are skipped).
    check_schedule(
        Schedule(window=parse_window("09:00-11:00", "2026-12-04")), has_variants=False, now=NOW
    )
    edge = datetime(2026, 12, 3, 23, 0, tzinfo=UTC)
    w = Schedule(window=parse_window("09:00-11:00", "2026-12-03"))
    check_schedule(w, has_variants=False, now=edge - timedelta(seconds=1))
    with pytest.raises(ScheduleError):
        check_schedule(w, has_variants=False, now=edge)


def test_schedule_from_flags() -> None:
    assert schedule_from_flags(None, None, None) is None
    window = schedule_from_flags("09:00-11:00", "2026-12-05", None)
    assert window == Schedule(window=parse_window("09:00-11:00", "2026-12-05"))
    assert schedule_from_flags(None, None, "rest:1h") == Schedule(waves=(Wave("rest", 3600.0),))
    with pytest.raises(ScheduleError, match="needs --local-window"):
        schedule_from_flags(None, "2026-12-05", None)
    with pytest.raises(ScheduleError, match="cannot be combined"):
        schedule_from_flags("09:00-11:00", None, "rest:1h")


def test_window_slot_gives_the_end_of_the_window_it_chose() -> None:
    w = parse_window("08:00-21:00")
    # Paris 08:30, inside: due now, until 21:00 Paris (20:00 UTC) that day.
    assert window_slot(w, PARIS, NOW) == (NOW, datetime(2026, 12, 4, 20, 0, tzinfo=UTC))
    # New York 02:30: that morning's window, 13:00-02:00 UTC (the end is the next UTC day).
    assert window_slot(w, NY, NOW) == (
        datetime(2026, 12, 4, 13, 0, tzinfo=UTC),
        datetime(2026, 12, 5, 2, 0, tzinfo=UTC),
    )
    # Ho Chi Minh City 14:30, inside: until 21:00 there, 14:00 UTC.
    assert window_slot(w, HCM, NOW) == (NOW, datetime(2026, 12, 4, 14, 0, tzinfo=UTC))
    late = parse_window("09:00-11:00")  # passed in Ho Chi Minh City: tomorrow's
    assert window_slot(late, HCM, NOW) == (
        datetime(2026, 12, 5, 2, 0, tzinfo=UTC),
        datetime(2026, 12, 5, 4, 0, tzinfo=UTC),
    )
    assert window_slot(parse_window("09:00-11:00", "2026-12-04"), HCM, NOW) is None


def test_plan_zones_gives_each_zone_its_deadline() -> None:
    plan = plan_zones(parse_window("08:00-21:00"), [("Asia/Ho_Chi_Minh", 1)], "Europe/Paris", NOW)
    assert plan.until == [
        datetime(2026, 12, 4, 20, 0, tzinfo=UTC).isoformat(),
        datetime(2026, 12, 4, 14, 0, tzinfo=UTC).isoformat(),
    ]
    passed = plan_zones(
        parse_window("09:00-11:00", "2026-12-04"), [("Asia/Ho_Chi_Minh", 1)], "Europe/Paris", NOW
    )
    assert passed.until[1] == PASSED and passed.send_after[1] == PASSED


def test_sms_campaigns_take_the_send_hours_as_their_window() -> None:
    hours = parse_window("08:00-21:00")
    assert sms_schedule("08:00-21:00", None) == Schedule(window=hours)
    inside = Schedule(window=parse_window("09:00-11:00", "2026-12-05"))
    assert sms_schedule("08:00-21:00", inside) == inside
    assert sms_schedule("", None) is None  # quiet hours off
    assert sms_schedule("", inside) == inside


@pytest.mark.parametrize("window", ["07:30-09:00", "20:00-21:30", "06:00-23:00"])
def test_sms_window_reaching_into_quiet_hours_is_refused(window: str) -> None:
    with pytest.raises(ScheduleError, match="quiet hours"):
        sms_schedule("08:00-21:00", Schedule(window=parse_window(window)))


def test_sms_refuses_waves_and_a_bad_send_hours_setting() -> None:
    with pytest.raises(ScheduleError, match="--waves"):
        sms_schedule("08:00-21:00", Schedule(waves=parse_waves("rest:1h")))
    with pytest.raises(ScheduleError, match="--waves"):
        sms_schedule("", Schedule(waves=parse_waves("rest:1h")))
    with pytest.raises(ScheduleError, match="FLASHSEND_SMS_SEND_HOURS"):
        sms_schedule("8am-9pm", None)
