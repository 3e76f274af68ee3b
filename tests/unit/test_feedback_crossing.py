"""Finding the event after which a campaign's counters cross its pause threshold (pure)."""

from __future__ import annotations

from typing import Any

from flashsend.lab.feedback_crossing import find_crossing
from streams.rules.feedback_logic import Thresholds

THRESHOLDS = Thresholds(complaint_rate=0.001, bounce_rate=0.05, min_sample=10_000)


def event(n: int, event_type: str, campaign: int = 7, **extra: Any) -> dict[str, Any]:
    return {
        "event_id": f"e{n}-{event_type}",
        "event_type": event_type,
        "recipient": f"u{n}@example.com",
        "campaign_id": campaign,
        "ses_message_id": f"m{n}",
        "received_at": 1_000_000 + n,
        "occurred_at": 999_000 + n,
        **extra,
    }


def test_the_crossing_event_is_the_first_after_which_the_rate_is_over() -> None:
    deliveries = [event(n, "Delivery") for n in range(10_000)]
    complaints = [event(10_000 + n, "Complaint") for n in range(15)]
    # Given in any order, with a redelivered complaint and another campaign's complaints.
    noise = [event(20_000 + n, "Complaint", campaign=8) for n in range(50)]
    records = [*reversed(deliveries + complaints), complaints[3], *noise]
    crossing = find_crossing(records, 7, THRESHOLDS)
    assert crossing is not None
    # 11 of 10,000 is the first rate above 0.1 %: the 11th complaint
    assert crossing.received_at_ms == complaints[10]["received_at"]
    assert crossing.occurred_at_ms == complaints[10]["occurred_at"]
    assert (crossing.window.delivered, crossing.window.complained) == (10_000, 11)
    assert crossing.events_before == 10_010
    assert crossing.reason.startswith("auto: complaint rate")


def test_no_crossing_below_the_minimum_sample_or_the_rate() -> None:
    few = [event(n, "Delivery") for n in range(100)] + [event(100, "Complaint")]
    assert find_crossing(few, 7, THRESHOLDS) is None
    clean = [event(n, "Delivery") for n in range(10_000)] + [
        event(10_000 + n, "Complaint") for n in range(10)
    ]
    assert find_crossing(clean, 7, THRESHOLDS) is None  # exactly 0.1 %: not above
