"""`campaign status` and `report` lines of a scheduled campaign."""

from __future__ import annotations

from flashsend.cli.campaign import format_slots


def _slot(at: str, total: int, sent: int, waiting: int) -> dict[str, object]:
    return {
        "slot_at": at,
        "recipients": total,
        "released_at": None,
        "sent": sent,
        "waiting": waiting,
        "in_progress": 0,
        "other": total - sent - waiting,
    }


def test_status_lists_the_open_slots_and_the_unknown_zones() -> None:
    schedule = {
        "local_window": {"start": "09:00", "end": "11:00", "date": "2026-12-05"},
        "unknown_timezones": {"Mars/Olympus_Mons": 20},
        "slots": [_slot("08:00Z", 150, 150, 0), _slot("09:00Z", 150, 0, 148)],
        "slots_released": 1,
        "waiting": 148,
    }
    text = format_slots(schedule)
    assert "local window 09:00-11:00 2026-12-05; 1/2 slot(s) released, 148 waiting" in text
    assert "Mars/Olympus_Mons" in text
    assert "08:00Z" not in text and "slot 09:00Z  total 150  sent 0" in text
    assert "slot 08:00Z" in format_slots(schedule, only_open=False)


def test_status_of_waves_and_of_an_unscheduled_campaign() -> None:
    schedule = {
        "waves": [{"tier": "recent", "span_s": 1800.0}, {"tier": "rest", "span_s": 172800.0}],
        "slots": [_slot(f"t{i}", 10, 0, 10) for i in range(20)],
        "slots_released": 0,
        "waiting": 200,
    }
    text = format_slots(schedule)
    assert "waves recent:1800s,rest:172800s" in text
    assert "… 8 more slot(s)" in text
    assert format_slots(None) == ""
