"""The SES stand-in's feedback (pure): outcomes, event records, subscriptions requests."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from infra.ses_standin.event_records import build_events
from infra.ses_standin.feedback_plan import (
    BOUNCE,
    COMPLAINT,
    DELAY,
    DELIVERED,
    OOTO,
    SOFT_BOUNCE,
    SUPPRESSED,
    FeedbackRates,
    message_rejected,
    recipient_outcome,
    simulator_outcome,
)
from infra.ses_standin.subscriptions import SubscriptionStore, parse_request
from producers.ses_events import parse_ses_message
from streams.rules.feedback_logic import ses_effect

NOW = datetime(2026, 5, 8, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("address", "outcome"),
    [
        ("success@simulator.amazonses.com", DELIVERED),
        ("bounce@simulator.amazonses.com", BOUNCE),
        ("bounce+run-7@simulator.amazonses.com", BOUNCE),
        ("ooto@simulator.amazonses.com", OOTO),
        ("complaint@simulator.amazonses.com", COMPLAINT),
        ("suppressionlist@simulator.amazonses.com", SUPPRESSED),
        ("anything@simulator.amazonses.com", DELIVERED),
        ("bounce@example.com", None),
    ],
)
def test_simulator_addresses(address: str, outcome: str | None) -> None:
    assert simulator_outcome(address) == outcome


def test_rates_pick_a_fixed_share_of_addresses_the_same_way_every_time() -> None:
    rates = FeedbackRates(p_bounce=0.02, p_complaint=0.003, p_soft_bounce=0.01, salt="s")
    addresses = [f"u{i}@example.com" for i in range(100_000)]
    outcomes = [recipient_outcome(a, rates) for a in addresses]
    share = {o: outcomes.count(o) / len(outcomes) for o in set(outcomes)}
    assert share[BOUNCE] == pytest.approx(0.02, abs=0.002)
    assert share[COMPLAINT] == pytest.approx(0.003, abs=0.001)
    assert share[SOFT_BOUNCE] == pytest.approx(0.01, abs=0.002)
    assert outcomes == [recipient_outcome(a, rates) for a in addresses]  # deterministic
    other = FeedbackRates(p_bounce=0.02, salt="other")
    assert {a for a, o in zip(addresses, outcomes, strict=True) if o == BOUNCE} != {
        a for a in addresses if recipient_outcome(a, other) == BOUNCE
    }
    assert recipient_outcome("bounce@simulator.amazonses.com", FeedbackRates()) == BOUNCE
    assert recipient_outcome("a@example.com", FeedbackRates()) == DELIVERED


def test_reject_is_per_message() -> None:
    rates = FeedbackRates(p_reject=0.5, salt="x")
    rejected = [message_rejected(f"m{i}", rates) for i in range(2_000)]
    assert 0.4 < sum(rejected) / len(rejected) < 0.6
    assert not any(message_rejected(f"m{i}", FeedbackRates()) for i in range(100))


@pytest.mark.parametrize(
    "changes",
    [{"p_bounce": 1.5}, {"p_bounce": "x"}, {"nope": 1}, {"p_bounce": 0.6, "p_complaint": 0.6}],
)
def test_rates_refuse_nonsense(changes: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        FeedbackRates().updated(changes)


def journal_record(**extra: Any) -> dict[str, Any]:
    return {
        "message_id": "0100018c-abc-000003",
        "time": NOW.timestamp(),
        "operation": "bulk",
        "from": "Flash Sale <sale@news.flashsend.test>",
        "destination": ["Lan <Lan@Example.com>"],
        "template": "flash_sale",
        "subject": "Lan, the sale starts",
        "headers": {"List-Unsubscribe": "<https://x.test/u/T>"},
        "tags": {"campaign": "42", "seq": "7"},
        "configuration_set": "marketing",
        "rendering_failure": None,
        **extra,
    }


@pytest.mark.parametrize(
    ("outcome", "types"),
    [
        (DELIVERED, ["Send", "Delivery"]),
        (BOUNCE, ["Send", "Bounce"]),
        (COMPLAINT, ["Send", "Delivery", "Complaint"]),
        (SOFT_BOUNCE, ["Send", "Bounce"]),
        (DELAY, ["Send", "DeliveryDelay", "Delivery"]),
        (OOTO, ["Send", "Delivery", "Bounce"]),
        (SUPPRESSED, ["Send", "Bounce"]),
    ],
)
def test_events_read_back_by_the_webhook_parser(outcome: str, types: list[str]) -> None:
    """What the stand-in publishes is what the webhook reads, and means what it should."""
    record = journal_record()
    events = build_events(record, [("Lan <Lan@Example.com>", outcome)], rejected=False, now=NOW)
    assert [t for t, _ in events] == types
    effects = []
    for event_type, event in events:
        assert event["eventType"] == event_type
        assert event["mail"]["tags"]["campaign"] == ["42"]
        assert event["mail"]["tags"]["ses:configuration-set"] == ["marketing"]
        assert {"name": "List-Unsubscribe", "value": "<https://x.test/u/T>"} in event["mail"][
            "headers"
        ]
        [parsed] = parse_ses_message(json.dumps(event), sns_message_id="s", received_at_ms=0)
        assert parsed["recipient"] == "lan@example.com" and parsed["seq"] == 7
        effects.append(ses_effect(parsed))
    suppressed = {e.suppress_reason for e in effects} - {None}
    assert suppressed == {BOUNCE: {"bounce"}, SUPPRESSED: {"bounce"}, COMPLAINT: {"complaint"}}.get(
        outcome, set()
    )


def test_reject_and_rendering_failure_end_the_message() -> None:
    rejected = build_events(journal_record(), [("a@x.test", DELIVERED)], rejected=True, now=NOW)
    assert [t for t, _ in rejected] == ["Send", "Reject"]
    failing = journal_record(rendering_failure="Attribute 'first_name' is not present")
    events = build_events(failing, [("a@x.test", DELIVERED)], rejected=False, now=NOW)
    assert [t for t, _ in events] == ["Send", "Rendering Failure"]
    assert events[1][1]["failure"]["templateName"] == "flash_sale"


def test_subscription_requests_and_store(tmp_path: Path) -> None:
    request = parse_request(
        {
            "endpoint": "http://127.0.0.1:9/sns",
            "topic_arn": "arn:aws:sns:us-east-1:000000000000:t",
            "configuration_sets": ["marketing"],
            "event_types": ["Bounce", "Complaint"],
            "signature_version": 2,
        }
    )
    store = SubscriptionStore(tmp_path / "subs.json")
    sub, confirm = store.subscribe(request, 1.0)
    assert confirm and sub.status == "pending" and store.confirmed() == []
    assert store.subscribe(request, 2.0) == (sub, True)  # same endpoint + topic: same one
    assert store.confirm(sub.topic_arn, "wrong") is None
    confirmed = store.confirm(sub.topic_arn, sub.token)
    assert confirmed is not None and confirmed.matches("marketing") and not confirmed.matches(None)
    assert confirmed.wants("Bounce") and not confirmed.wants("Delivery")
    reloaded = SubscriptionStore(tmp_path / "subs.json")
    assert reloaded.confirmed() == [confirmed]
    assert reloaded.delete_by_arn(confirmed.arn) and reloaded.all() == []


@pytest.mark.parametrize(
    "body",
    [
        {"endpoint": "ftp://x/sns", "topic_arn": "arn:aws:sns:us-east-1:1:t"},
        {"endpoint": "http://x/sns", "topic_arn": "not-an-arn"},
        {
            "endpoint": "http://x/sns",
            "topic_arn": "arn:aws:sns:us-east-1:1:t",
            "event_types": ["Subscription"],
        },
        {
            "endpoint": "http://x/sns",
            "topic_arn": "arn:aws:sns:us-east-1:1:t",
            "signature_version": 3,
        },
    ],
)
def test_bad_subscription_requests(body: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        parse_request(body)


def test_only_the_wanted_event_types_are_built() -> None:
    plan = [("a@x.test", COMPLAINT), ("b@x.test", DELIVERED)]
    every = build_events(journal_record(), plan, rejected=False, now=NOW)
    wanted = build_events(journal_record(), plan, rejected=False, now=NOW, wanted={"Complaint"})
    assert [t for t, _ in wanted] == ["Complaint"]
    assert wanted[0][1] == next(e for t, e in every if t == "Complaint")  # same feedback id
    assert build_events(journal_record(), plan, rejected=False, now=NOW, wanted={"Bounce"}) == []
    assert [t for t, _ in build_events(journal_record(), plan, rejected=True, now=NOW)] == [
        "Send",
        "Reject",
    ]
