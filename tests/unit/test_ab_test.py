"""The A/B test's pure parts: assignment, parsing, the winner's choice and when it is due."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from infra.ses_standin.event_records import build_events
from infra.ses_standin.feedback_plan import (
    BOUNCE,
    CLICKED,
    DELIVERED,
    OPENED,
    Engagement,
    engagement_of,
)
from streams.rules.ab_test import (
    Variant,
    VariantCounts,
    VariantError,
    assignment_bucket,
    bounds,
    check_variants,
    choose_winner,
    missing_event_type,
    parse_duration,
    parse_variant,
    variant_for,
    winner_due,
)
from streams.rules.feedback_logic import ses_effect

AB = [Variant("A", "sale_a", 10), Variant("B", "sale_b", 10)]


def test_assignment_is_stable_and_splits_by_the_percents() -> None:
    users = range(1, 40_001)
    first = [variant_for(7, u, AB) for u in users]
    assert first == [variant_for(7, u, AB) for u in users]  # deterministic
    shares = {name: first.count(name) / len(first) for name in ("A", "B", None)}
    assert abs(shares["A"] - 0.10) < 0.01 and abs(shares["B"] - 0.10) < 0.01, shares
    assert abs(shares[None] - 0.80) < 0.01, shares
    # Another campaign draws other users: the test share is not always the same people.
    other = [variant_for(8, u, AB) for u in users]
    assert sum(a != b for a, b in zip(first, other, strict=True)) > 5_000


def test_bucket_is_md5_of_campaign_and_user() -> None:
    # The SQL twin computes ('x' || left(md5('7:42'), 8))::bit(32)::bigint % 10000.
    import hashlib

    digest = hashlib.md5(b"7:42").hexdigest()
    assert assignment_bucket(7, 42) == int(digest[:8], 16) % 10_000
    assert bounds([Variant("A", "a", 12.5), Variant("B", "b", 30)]) == [1250, 4250]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("A=sale_a:10", Variant("A", "sale_a", 10)),
        ("B=sale_b", Variant("B", "sale_b", 10)),
        ("long_name-2=t:12.5%", Variant("long_name-2", "t", 12.5)),
    ],
)
def test_variant_parses(text: str, expected: Variant) -> None:
    assert parse_variant(text) == expected


@pytest.mark.parametrize(
    "text", ["A", "A=", "=t:10", "A B=t", "A=t:x", "A=t:0", "A=t:101", "A=t:1.234"]
)
def test_bad_variant_is_refused(text: str) -> None:
    with pytest.raises(VariantError):
        parse_variant(text)


def test_variants_need_two_distinct_names_within_100_percent() -> None:
    with pytest.raises(VariantError, match="at least two"):
        check_variants([Variant("A", "a", 10)])
    with pytest.raises(VariantError, match="differ"):
        check_variants([Variant("A", "a", 10), Variant("A", "b", 10)])
    with pytest.raises(VariantError, match="100"):
        check_variants([Variant("A", "a", 60), Variant("B", "b", 40.01)])
    assert len(check_variants([Variant("A", "a", 50), Variant("B", "b", 50)])) == 2


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90),
        ("45s", 45),
        ("5m", 300),
        ("2h", 7200),
        ("1h30m", 5400),
        ("1.5h", 5400),
        ("1d", 86400),
        (" 0 ", 0),
    ],
)
def test_duration_parses(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "h", "5x", "1h 30m", "-5", "2hh", "m5"])
def test_bad_duration_is_refused(text: str) -> None:
    with pytest.raises(VariantError):
        parse_duration(text)


def test_winner_is_the_best_rate_and_a_tie_goes_to_the_first_variant() -> None:
    a = VariantCounts("A", sent=1000, delivered=1000, clicked=20, opened=300)
    b = VariantCounts("B", sent=1000, delivered=800, clicked=24, opened=200)
    assert choose_winner([a, b], "clicks")[0] == "B"  # 3.0 % of delivered beats 2.0 %
    assert choose_winner([a, b], "opens")[0] == "A"  # 30 % beats 25 %
    tie = VariantCounts("B", sent=500, delivered=500, clicked=10)
    assert choose_winner([a, tie], "clicks")[0] == "A"
    assert choose_winner([tie, a], "clicks")[0] == "B"
    zero = [VariantCounts("A"), VariantCounts("B")]  # nothing counted: the first one
    assert choose_winner(zero, "clicks")[0] == "A"
    # Without Delivery events the rate is per sent mail.
    no_delivery = VariantCounts("B", sent=100, clicked=5)
    assert choose_winner([a, no_delivery], "clicks")[0] == "B"
    with pytest.raises(VariantError):
        choose_winner([a, b], "manual")


def test_winner_is_due_after_the_wait_from_the_snapshot() -> None:
    snapshot = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)
    assert not winner_due(snapshot, 7200, snapshot + timedelta(seconds=7199))
    assert winner_due(snapshot, 7200, snapshot + timedelta(seconds=7200))
    assert not winner_due(None, 0, snapshot)  # not started


def test_automatic_winner_needs_its_event_type_published() -> None:
    published = ("Delivery", "Bounce", "Complaint")
    assert missing_event_type("manual", published) is None
    assert "Click" in (missing_event_type("clicks", published) or "")
    assert "Open" in (missing_event_type("opens", published) or "")
    assert missing_event_type("clicks", (*published, "Click")) is None


def _event(event_type: str, tags: dict[str, str]) -> dict[str, object]:
    return {
        "event_id": "00000000-0000-5000-8000-000000000001",
        "event_type": event_type,
        "recipient": "u1@x.test",
        "ses_message_id": "m1",
        "occurred_at": 1_764_800_000_000,
        "campaign_id": 9,
        "seq": 1,
        "tags": tags,
        "bounce_type": "Permanent" if event_type == "Bounce" else None,
    }


def test_feedback_counts_a_variants_events_from_its_tag() -> None:
    tagged = {"campaign": "9", "seq": "1", "variant": "B"}
    assert ses_effect(_event("Click", tagged)).variant_counter == "clicked"
    assert ses_effect(_event("Open", tagged)).variant_counter == "opened"
    assert ses_effect(_event("Delivery", tagged)).variant_counter == "delivered"
    assert ses_effect(_event("Bounce", tagged)).variant_counter == "bounced"
    assert ses_effect(_event("Click", tagged)).variant == "B"
    assert ses_effect(_event("Send", tagged)).variant_counter is None
    untagged = ses_effect(_event("Click", {"campaign": "9", "seq": "1"}))
    assert untagged.variant is None and untagged.variant_counter is None


def test_standin_engagement_is_fixed_per_template_and_address() -> None:
    likes_b = Engagement(p_open=0.5, p_click=0.2)
    addresses = [f"u{i}@x.test" for i in range(4000)]
    got = [engagement_of(a, DELIVERED, "sale_b", likes_b) for a in addresses]
    assert got == [engagement_of(a, DELIVERED, "sale_b", likes_b) for a in addresses]
    clicks, opens = got.count(CLICKED), got.count(OPENED)
    assert abs(clicks / 4000 - 0.2) < 0.03 and abs((clicks + opens) / 4000 - 0.5) < 0.03
    assert engagement_of(addresses[0], BOUNCE, "sale_b", Engagement(1.0, 1.0)) is None
    assert all(engagement_of(a, DELIVERED, "sale_a", Engagement()) is None for a in addresses)


def test_standin_builds_open_and_click_events_after_the_deliveries() -> None:
    record = {
        "message_id": "m1",
        "time": 1.7e9,
        "from": "shop@example.com",
        "destination": ["u1@x.test"],
        "operation": "bulk",
        "tags": {"campaign": "9", "seq": "1", "variant": "B"},
    }
    plan = [("u1@x.test", DELIVERED)]
    now = datetime(2026, 12, 4, tzinfo=UTC)
    events = build_events(record, plan, rejected=False, now=now, engaged={"u1@x.test": CLICKED})
    assert [t for t, _ in events] == ["Send", "Delivery", "Open", "Click"]
    assert events[3][1]["mail"]["tags"]["variant"] == ["B"]
    assert "link" in events[3][1]["click"]
    wanted = build_events(
        record, plan, rejected=False, now=now, wanted={"Click"}, engaged={"u1@x.test": OPENED}
    )
    assert wanted == []
