"""Which SES events settle a row in doubt, and how (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from streams.rules.feedback_logic import ses_effect
from streams.rules.resolution import (
    FAILED,
    OUTCOME_BY_EVENT,
    SENT,
    EventProof,
    in_doubt_summary,
    parse_duration,
    proof_of,
    resend_refusal,
    settle,
)


def record(event_type: str, **extra: Any) -> dict[str, Any]:
    return {
        "event_id": "e",
        "event_type": event_type,
        "recipient": "u1@x.test",
        "ses_message_id": "m-1",
        "campaign_id": 42,
        "seq": 7,
        "occurred_at": 1_000,
        **extra,
    }


@pytest.mark.parametrize(
    ("event_type", "outcome"),
    [
        ("Send", SENT),
        ("Delivery", SENT),
        ("Bounce", SENT),
        ("Complaint", SENT),
        ("DeliveryDelay", SENT),
        ("Reject", FAILED),
        ("Rendering Failure", FAILED),
    ],
)
def test_each_delivery_event_proves_an_outcome(event_type: str, outcome: str) -> None:
    assert proof_of(record(event_type)) == EventProof(42, 7, "u1@x.test", outcome, "m-1", 1_000)


@pytest.mark.parametrize("event_type", ["Open", "Click", "Subscription", "Bounce "])
def test_other_event_types_prove_nothing(event_type: str) -> None:
    assert event_type not in OUTCOME_BY_EVENT
    assert proof_of(record(event_type)) is None


@pytest.mark.parametrize(
    "missing",
    [{"campaign_id": None}, {"seq": None}, {"seq": 0}, {"seq": 2**31}, {"seq": -3}],
)
def test_an_event_without_a_usable_row_key_proves_nothing(missing: dict[str, Any]) -> None:
    """Transactional mail has no campaign/seq tags; the row key is (bigint, int4 > 0)."""
    assert proof_of(record("Send", **missing)) is None


def test_the_feedback_effect_carries_the_proof() -> None:
    effect = ses_effect({**record("Delivery"), "sns_message_id": "s"})
    assert effect.proof == proof_of(record("Delivery"))
    assert ses_effect({**record("Open"), "sns_message_id": "s"}).proof is None


def proof(seq: int, outcome: str, at: int, campaign: int = 1) -> EventProof:
    return EventProof(campaign, seq, f"u{seq}@x.test", outcome, f"m{seq}-{at}", at)


def test_settle_keeps_one_proof_per_row_failure_first_then_the_earliest() -> None:
    proofs = [
        proof(3, SENT, 30),
        proof(1, SENT, 20),
        proof(1, SENT, 10),
        proof(2, SENT, 5),
        proof(2, FAILED, 50),  # a Reject after its Send
        proof(1, SENT, 5, campaign=0),
    ]
    assert settle(proofs) == [
        proof(1, SENT, 5, campaign=0),
        proof(1, SENT, 10),
        proof(2, FAILED, 50),
        proof(3, SENT, 30),
    ]
    assert settle([]) == []


def test_in_doubt_summary_counts_resolved_and_still_unknown() -> None:
    rows = [
        ("sent", None, 900),
        ("sent", "resolved_by_event", 40),
        ("failed", "resolved_by_event", 2),
        ("sent", "event_before_answer", 7),
        ("unknown", "lease_expired", 5),
        ("unknown", "ses_timeout", 1),
        ("pending", "resend_unknown", 3),
        ("failed", "MESSAGE_REJECTED", 1),
    ]
    assert in_doubt_summary(rows, resent=3) == {
        "resolved_sent": 40,
        "resolved_failed": 2,
        "event_before_answer": 7,
        "still_unknown": 6,
        "queued_again": 3,
        "resent": 3,
    }


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("15m", 900), ("2h", 7200), ("1h30m", 5400), ("1d", 86400), ("0.5s", 0.5)],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "15", "m", "15x", "1h 30", "-5m", "5m!"])
def test_parse_duration_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ValueError, match=r"e\.g\. 90s, 15m"):
        parse_duration(text)


def test_resend_refusal_allows_only_campaigns_that_can_still_send() -> None:
    assert [resend_refusal(s) for s in ("sending", "paused", "done")] == [None, None, None]
    assert "cancelled" in str(resend_refusal("cancelled"))
    for status in ("draft", "snapshotting", "failed"):
        assert f"it is {status}" in str(resend_refusal(status))


def test_a_push_campaigns_unknown_rows_are_never_resent() -> None:
    for status in ("sending", "paused", "done"):
        assert "push campaign" in str(resend_refusal(status, "push"))
    assert resend_refusal("done", "sms") is None
