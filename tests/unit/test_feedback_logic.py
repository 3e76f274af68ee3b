"""What a feedback event does and when a campaign pauses itself (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from streams.rules.feedback_logic import (
    FeedbackEffect,
    Thresholds,
    Window,
    pause_reason,
    ses_effect,
    unsubscribe_effect,
)


def record(event_type: str, to: str = "a@x.test", **extra: Any) -> dict[str, Any]:
    return {
        "event_id": "e1",
        "event_type": event_type,
        "recipient": to,
        "ses_message_id": "m1",
        "campaign_id": 42,
        **extra,
    }


@pytest.mark.parametrize(
    ("event_type", "extra", "counter", "suppress"),
    [
        ("Send", {}, "sent", None),
        ("Delivery", {}, "delivered", None),
        ("Bounce", {"bounce_type": "Permanent", "bounce_sub_type": "General"}, "bounced", "bounce"),
        (
            "Bounce",
            {"bounce_type": "Permanent", "bounce_sub_type": "OnAccountSuppressionList"},
            "bounced",
            "bounce",
        ),
        (
            "Bounce",
            {"bounce_type": "Transient", "bounce_sub_type": "MailboxFull"},
            "soft_bounced",
            None,
        ),
        ("Bounce", {"bounce_type": "Undetermined"}, "soft_bounced", None),
        ("Bounce", {}, "soft_bounced", None),
        ("Complaint", {"complaint_type": "abuse"}, "complained", "complaint"),
        ("Complaint", {}, "complained", "complaint"),
        ("Reject", {}, "rejected", None),
        ("DeliveryDelay", {}, "delayed", None),
        ("Rendering Failure", {}, "rendering_failed", None),
        ("Open", {}, None, None),
    ],
)
def test_effect_of_each_event(
    event_type: str, extra: dict[str, Any], counter: str | None, suppress: str | None
) -> None:
    effect = ses_effect(record(event_type, **extra))
    assert (effect.counter, effect.suppress_reason) == (counter, suppress)
    assert (effect.campaign_id, effect.email, effect.event_id) == (42, "a@x.test", "e1")
    assert effect.source_event.endswith("ses:m1")


def test_source_event_says_why() -> None:
    bounce = record("Bounce", bounce_type="Permanent", bounce_sub_type="General")
    assert ses_effect(bounce).source_event == "Bounce Permanent/General ses:m1"
    complaint = ses_effect(record("Complaint", complaint_type="abuse"))
    assert complaint.source_event == "Complaint abuse ses:m1"


@pytest.mark.parametrize(
    "to", ["bounce@simulator.amazonses.com", "complaint+x@Simulator.AmazonSES.com"]
)
def test_simulator_addresses_are_never_suppressed_nor_counted(to: str) -> None:
    for event in (record("Bounce", to, bounce_type="Permanent"), record("Complaint", to)):
        effect = ses_effect(event)
        assert (effect.counter, effect.suppress_reason) == (None, None)


def test_transactional_mail_has_no_campaign_but_still_suppresses() -> None:
    effect = ses_effect(record("Complaint", campaign_id=None))
    assert effect == FeedbackEffect(
        "e1", "a@x.test", None, "complained", "complaint", "Complaint - ses:m1"
    )


def test_unsubscribe_only_counts() -> None:
    effect = unsubscribe_effect(
        {"event_id": "u1", "email": "a@x.test", "campaign_id": 7, "user_id": 3}
    )
    assert (effect.counter, effect.suppress_reason, effect.campaign_id) == ("unsubscribed", None, 7)


T = Thresholds(complaint_rate=0.001, bounce_rate=0.05, min_sample=10_000)


@pytest.mark.parametrize(
    ("window", "paused"),
    [
        (Window(sent=9_999, delivered=9_000, bounced=0, complained=50), False),  # sample too small
        (Window(sent=10_000, delivered=9_800, bounced=100, complained=10), False),  # exactly 0.1 %
        (Window(sent=10_000, delivered=9_800, bounced=100, complained=11), True),  # 0.11 %
        (Window(sent=0, delivered=9_990, bounced=10, complained=11), True),  # no Send events
        (Window(sent=20_000, delivered=9_990, bounced=10, complained=11), False),  # base = sent
        (Window(sent=10_000, delivered=9_000, bounced=500, complained=0), False),  # 5 % exactly
        (Window(sent=10_000, delivered=9_000, bounced=501, complained=0), True),
    ],
)
def test_pause_reason(window: Window, paused: bool) -> None:
    assert (pause_reason(window, T) is not None) is paused


def test_pause_reason_names_the_rate_and_the_sample() -> None:
    window = Window(sent=12_000, delivered=11_000, bounced=100, complained=36)
    assert pause_reason(window, T) == "auto: complaint rate 0.30% > 0.10% (36 of 12,000 sent)"
    bounced = Window(sent=0, delivered=9_000, bounced=1_000, complained=0)
    assert (
        pause_reason(bounced, T) == "auto: hard bounce rate 10.00% > 5.00% (1,000 of 10,000 sent)"
    )


def test_window_counts_since_the_last_automatic_pause() -> None:
    row = {
        "sent": 30_000,
        "delivered": 29_000,
        "bounced": 300,
        "complained": 40,
        "window_sent": 20_000,
        "window_delivered": 19_500,
        "window_bounced": 200,
        "window_complained": 39,
    }
    assert Window.of(row) == Window(sent=10_000, delivered=9_500, bounced=100, complained=1)


@pytest.mark.parametrize("kwargs", [{"complaint_rate": 0}, {"bounce_rate": 1.5}, {"min_sample": 0}])
def test_thresholds_refuse_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Thresholds(**kwargs)


def test_opens_and_clicks_name_the_row_whose_user_they_date() -> None:
    def event(event_type: str, **extra: object) -> dict[str, object]:
        base: dict[str, object] = {
            "event_id": "5f1c9a0e-7f44-4b59-9a43-6f9e0f4d2a11",
            "event_type": event_type,
            "recipient": "a@x.test",
            "ses_message_id": "m",
            "campaign_id": 3,
            "seq": 42,
            "occurred_at": 1_800_000_000_123,
        }
        return {**base, **extra}

    opened = ses_effect(event("Open"))
    assert (opened.engaged, opened.engaged_seq, opened.engaged_at_s) == (
        "open",
        42,
        1_800_000_000.123,
    )
    assert ses_effect(event("Click")).engaged == "click"
    assert ses_effect(event("Delivery")).engaged is None
    assert ses_effect(event("Open", seq=None)).engaged is None  # no row to find the user by
    assert ses_effect(event("Open", campaign_id=None)).engaged is None  # transactional mail
    assert ses_effect(event("Open", recipient="success@simulator.amazonses.com")).engaged is None
    assert ses_effect(event("Open", occurred_at=0)).engaged_at_s is None  # counted as now
