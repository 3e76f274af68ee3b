"""Pure decisions of the transactional path (no network)."""

from __future__ import annotations

import json
import random
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import KafkaError

from producers.outbox_relay import is_transient, lock_key
from schemas.serde import AvroCodec, SerdeError, registry_client
from sinks.mail_store import Transition, cancel_outcome, lifecycle_params, transition_events
from streams.rules.backoff import RetryPolicy
from streams.rules.mail_logic import (
    CancelMail,
    CancelResult,
    ConfigError,
    CreateMail,
    Decision,
    Delivery,
    Next,
    Poison,
    StaleEvent,
    cancel_events,
    cancel_result,
    check_lease,
    decide_after_call,
    lifecycle_events,
    parse_order_event,
    purge_horizon,
    worst_send_s,
)

NOW_MS = 1_800_000_000_000


def event(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "event_id": "0199a1f0-0000-7000-8000-000000000042",
        "event_type": "OrderConfirmed",
        "version": 1,
        "occurred_at": NOW_MS - 1000,
        "dedupe_key": "order-confirmed:42",
        "order_id": 42,
        "email": "b@example.com",
        "customer_name": "Lan",
        "locale": "vi",
        "total": "1250000",
        "currency": "VND",
        "items": [],
        "send_after": None,
        "template": None,
        "reason": None,
    }
    base.update(fields)
    return base


def parse(ev: dict[str, Any], max_age_s: float = 86400) -> Any:
    return parse_order_event(
        ev, now_ms=NOW_MS, max_age_s=max_age_s, at_most_once_templates=("payment_notice",)
    )


def test_confirmed_becomes_a_mail_keyed_by_intent() -> None:
    cmd = parse(event(send_after=NOW_MS + 60_000))
    assert isinstance(cmd, CreateMail)
    assert (cmd.dedupe_key, cmd.ref, cmd.template, cmd.delivery) == (
        "order-confirmed:42",
        "42",
        "order_confirmation",
        Delivery.AT_LEAST_ONCE,
    )
    assert cmd.send_after is not None and cmd.send_after.timestamp() * 1000 == NOW_MS + 60_000
    assert parse(event(template="payment_notice")).delivery is Delivery.AT_MOST_ONCE


def test_cancel_targets_the_confirmation_key_even_before_it_exists() -> None:
    cmd = parse(event(event_type="OrderCancelled", email=None))
    assert isinstance(cmd, CancelMail) and cmd.keys == ["order-confirmed:42"] and cmd.ref == "42"


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"event_type": "OrderShipped"}, "unknown_event_type"),
        ({"version": 2}, "unsupported_version"),
        ({"email": "not-an-address"}, "bad_email"),
        ({"event_id": ""}, "missing_field"),
    ],
)
def test_poison_is_named_never_raised(fields: dict[str, Any], reason: str) -> None:
    """Trap 5/6: content we cannot act on is poison (DLQ at once), not an exception that
    would make the consumer retry the same record forever."""
    result = parse(event(**fields))
    assert isinstance(result, Poison) and result.reason == reason


def test_stale_events_are_ignored() -> None:
    """The replay trap: an offset reset re-reads last week's events; they must not mail. The
    stale confirmation says which key it was for (recorded for `flashsend mail status`)."""
    stale = parse(event(occurred_at=NOW_MS - 2 * 86_400_000))
    assert isinstance(stale, StaleEvent)
    assert (stale.dedupe_key, stale.ref, stale.event_type) == (
        "order-confirmed:42",
        "42",
        "OrderConfirmed",
    )
    assert stale.age_s == 2 * 86_400
    assert isinstance(parse(event(occurred_at=NOW_MS - 2 * 86_400_000), max_age_s=0), CreateMail)


@pytest.mark.parametrize("age_days", [1.5, 7, 365])
def test_cancels_of_any_age_are_applied(age_days: float) -> None:
    """A cancel replayed the next day (from the DLQ, after an outage) must still stop the
    delayed mail of a cancelled order: only confirmations obey the age rule. Naive version:
    the age check ran before the cancel branch and dropped it as stale."""
    old = int(NOW_MS - age_days * 86_400_000)
    cmd = parse(event(event_type="OrderCancelled", email=None, occurred_at=old))
    assert isinstance(cmd, CancelMail) and cmd.keys == ["order-confirmed:42"]


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"event_id": "order-42"}, "bad_event_id"),
        ({"occurred_at": 10**18}, "bad_timestamp"),
        ({"occurred_at": NOW_MS * 1000}, "bad_timestamp"),  # microseconds
        ({"occurred_at": NOW_MS // 1000}, "bad_timestamp"),  # seconds
        ({"send_after": 10**18}, "bad_timestamp"),
        ({"send_after": NOW_MS // 1000}, "bad_timestamp"),
        ({"customer_name": "Lan\x00"}, "bad_text"),
        ({"dedupe_key": "k" * 3000}, "bad_key"),
        ({"template": "t" * 65}, "bad_key"),
    ],
)
def test_fields_out_of_their_domain_are_poison(fields: dict[str, Any], reason: str) -> None:
    """A value the columns or datetime cannot hold is dead-lettered with a reason, never
    raised in the agent (a crash loop) nor sent to PostgreSQL (retried forever)."""
    result = parse(event(**fields))
    assert isinstance(result, Poison) and result.reason == reason, result


POLICY = RetryPolicy(3, base=1.0, cap=10.0)


def decide(delivery: Delivery, send_errors: int = 0, **call: Any) -> Decision:
    args: dict[str, Any] = {"code": None, "http_status": None, "timed_out": False}
    args.update(call)
    return decide_after_call(
        delivery=delivery,
        send_errors=send_errors,
        policy=POLICY,
        now=1000.0,
        rng=random.Random(1),
        **args,
    )


def test_no_answer_depends_on_the_template() -> None:
    """The duplicate window: at-most-once -> unknown, at-least-once -> resend, then unknown
    (never `failed`: the mail may have gone)."""
    calls: list[dict[str, Any]] = [
        {"code": "ReadTimeout", "timed_out": True},
        {"code": "X", "http_status": 503},
    ]
    for call in calls:
        assert decide(Delivery.AT_MOST_ONCE, **call).next is Next.UNKNOWN
        retry = decide(Delivery.AT_LEAST_ONCE, **call)
        assert retry.next is Next.RETRY and 1000.0 <= (retry.retry_at or 0) < 1001.0
        assert decide(Delivery.AT_LEAST_ONCE, send_errors=3, **call).next is Next.UNKNOWN


def test_explicit_failures() -> None:
    refused = decide(Delivery.AT_MOST_ONCE, code="ConnectError")
    assert refused.next is Next.RETRY and refused.counts_as_error  # nothing was sent
    assert decide(Delivery.AT_LEAST_ONCE, send_errors=3, code="ConnectError").next is Next.FAILED
    throttled = decide(
        Delivery.AT_MOST_ONCE, send_errors=3, code="TooManyRequestsException", http_status=429
    )
    assert throttled.next is Next.RETRY and not throttled.counts_as_error
    rejected = decide(Delivery.AT_LEAST_ONCE, code="MessageRejected", http_status=400)
    assert rejected.next is Next.FAILED
    paused = decide(Delivery.AT_LEAST_ONCE, code="SendingPausedException", http_status=400)
    assert paused.next is Next.RETRY


def test_backoff_grows_with_jitter() -> None:
    delays = [
        decide(Delivery.AT_LEAST_ONCE, send_errors=n, code="ConnectError").retry_at
        for n in range(3)
    ]
    assert all(d is not None for d in delays)
    ceilings = [1000.0 + 1.0, 1000.0 + 2.0, 1000.0 + 4.0]
    assert all(1000.0 <= d < c for d, c in zip(delays, ceilings, strict=True))  # type: ignore[operator]


def test_lifecycle_events_answer_a_cancel_in_flight() -> None:
    assert lifecycle_events("sent", False) == ["EmailSent"]
    assert lifecycle_events("sent", True) == ["EmailSent", "EmailCancelTooLate"]
    assert lifecycle_events("unknown", True) == ["EmailFailed", "EmailCancelTooLate"]
    assert lifecycle_events("cancelled", True) == ["EmailCancelled"]
    assert lifecycle_events("pending", False) == []


def test_cancel_results_tell_too_late_from_already_cancelled() -> None:
    """Cancel trap 3: 0 rows has two meanings; the statement returns old.status instead."""
    assert cancel_result(None, True) is CancelResult.TOMBSTONE
    assert cancel_result("pending", False) is CancelResult.CANCELLED
    assert cancel_result("sending", False) is CancelResult.IN_FLIGHT
    assert cancel_result("sent", False) is CancelResult.TOO_LATE
    assert cancel_result("failed", False) is CancelResult.NOTHING
    assert cancel_events(CancelResult.IN_FLIGHT) == []
    results, events = cancel_outcome(
        [
            (1, "k", "42", "cancelled", None, True, 0, None),
            (2, "j", "42", "sent", "sent", False, 1, "m"),
        ]
    )
    assert results == [("k", CancelResult.TOMBSTONE), ("j", CancelResult.TOO_LATE)]
    assert [(r.dedupe_key, t) for r, t, _ in events] == [
        ("k", "EmailCancelled"),
        ("j", "EmailCancelTooLate"),
    ]


def test_lifecycle_params_are_keyed_by_order() -> None:
    row = Transition(5, "order-confirmed:42", "42", "sent", False, 1, "m-1")
    params = lifecycle_params("mail.events", transition_events([row], None))
    assert params is not None
    assert (params["msg_keys"], params["event_types"]) == (["42"], ["EmailSent"])
    assert json.loads(params["payloads"][0])["message_id"] == "m-1"
    assert lifecycle_params("mail.events", []) is None


def test_lease_must_outlast_the_worst_send() -> None:
    """Architecture-1 trap 3: the seed's '3 s' timeout took 6.4 s; the rule uses a bound."""
    assert worst_send_s(3.0) >= 6.4
    check_lease(30.0, 5.0)
    with pytest.raises(ConfigError):
        check_lease(10.0, 5.0)


def test_lease_must_outlast_the_wait_for_the_limiter() -> None:
    # 8 claimed mails at 0.5/s: the last one calls SES 16 s after its claim, so a 30-s lease
    # with a 12-s worst send would expire under it and another worker would send it again.
    check_lease(30.0, 5.0, concurrency=8, rate=40.0)
    with pytest.raises(ConfigError, match="FLASHSEND_MAIL_CONCURRENCY"):
        check_lease(30.0, 5.0, concurrency=8, rate=0.5)


def test_purge_horizon_rules() -> None:
    now = time.time()
    assert purge_horizon(now, retention_s=8.0, topic_retention_s=7.0, max_event_age_s=1.0) == (
        now - 8.0
    )
    for bad in ({"retention_s": 6.0}, {"topic_retention_s": 0.0}, {"max_event_age_s": 9.0}):
        kwargs: dict[str, float] = {
            "retention_s": 8.0,
            "topic_retention_s": 7.0,
            "max_event_age_s": 1.0,
            **bad,
        }
        with pytest.raises(ConfigError):
            purge_horizon(now, **kwargs)


def test_relay_error_classes_and_lock_key() -> None:
    assert is_transient(KafkaError._MSG_TIMED_OUT) and is_transient(KafkaError._TRANSPORT)
    assert not is_transient(KafkaError.MSG_SIZE_TOO_LARGE)
    assert lock_key("outbox") == lock_key("outbox") != lock_key("mail_outbox")
    assert lock_key("outbox") < 2**63


def test_order_event_contract_round_trip_and_evolution() -> None:
    """Versioned Avro: the envelope carries `version`; a record written with the writer
    schema decodes; garbage is a SerdeError (-> DLQ)."""
    codec = AvroCodec(registry_client("mock://mail-unit"), "order_event")
    record = event(
        event_id=str(uuid.uuid4()),
        items=[{"sku": "A1", "name": "Áo dài", "quantity": 2, "price": "625000"}],
    )
    assert codec.decode(codec.encode(record)) == record
    with pytest.raises(SerdeError):
        codec.decode(b"\x00\x00\x00\x00\x09garbage")
    lifecycle = AvroCodec(registry_client("mock://mail-unit"), "mail_lifecycle")
    assert lifecycle.schema_id != codec.schema_id
