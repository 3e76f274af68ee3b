"""What a frame of a campaign's event stream carries, from `campaign status`'s view."""

from __future__ import annotations

from flashsend.api.events import progress_frame, sse


def test_a_frame_has_counts_rate_eta_and_the_paused_reason() -> None:
    view = {
        "id": 7,
        "status": "paused",
        "reason": "complaint rate 0.2 %",
        "pending": 900,
        "sending": 100,
        "sent": 4000,
        "send_rate_per_s": 200.0,
        "feedback_lag_s": 0.4,
    }
    frame = progress_frame(view, now=10.0)
    assert frame["eta_s"] == 5.0 and frame["rate_per_s"] == 200.0
    assert frame["paused_reason"] == "complaint rate 0.2 %" and frame["feedback_lag_s"] == 0.4
    assert frame["sent"] == 4000 and frame["at"] == 10.0


def test_no_eta_without_a_rate_and_no_paused_reason_while_sending() -> None:
    frame = progress_frame({"status": "sending", "reason": None, "pending": 5}, now=0.0)
    assert frame["eta_s"] is None and frame["paused_reason"] is None


def test_sse_frames_are_events_with_json_data() -> None:
    assert sse({"a": 1}) == b'event: progress\ndata: {"a": 1}\n\n'
    assert sse(None).startswith(b"event: gone\n")
