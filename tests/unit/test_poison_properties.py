"""Poison never blocks: property-based tests over each consumed contract's field domains.

For every contract a consumer reads (order_event on order.events; ses_event, unsubscribed and
mail_lifecycle on mail.events; campaign_recipient on campaign.recipients) hypothesis writes
records whose fields range over the whole Avro domain and its edges — timestamps of 0, 1e18,
microseconds or seconds where milliseconds are meant, non-UUID ids, strings with NUL or of
100k characters, unknown type names, extreme integers — and then damages some of the bytes
(truncated, another schema id, another magic byte, garbage). The consumer's parse must:

- never raise (a raise crashes the worker, and the restart meets the same record: a crash loop);
- either dead-letter the record with a reason, or produce an effect whose every value fits
  where it goes (a uuid column, a btree key, text without NUL, a timestamp) — a value that
  does not fit fails its statement, which is retried forever: a stuck partition.

The naive versions these catch: the age check before `fromtimestamp` (1e18 raised
ValueError/OverflowError in the agent), an event id taken as it came (the uuid cast failed in
the batch transaction, retried forever).
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from producers.dlq import DeadLetter
from schemas.doorbell import DoorbellWriter
from schemas.serde import AvroCodec, registry_client
from sinks.order_store import MailEvent
from streams.feedback_ingest import parse_feedback_record
from streams.mail_ingest import parse_record
from streams.rules.feedback_logic import FeedbackEffect
from streams.rules.field_domains import MAX_EPOCH_MS, MAX_KEY_CHARS, text_problem, uuid_problem
from streams.rules.mail_logic import CancelMail, CreateMail, StaleEvent
from streams.sender import decode_doorbell

REGISTRY = "mock://poison-properties"
NOW_MS = 1_800_000_000_000
PROPERTY = settings(
    max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


@dataclass(frozen=True)
class Rec:
    value: bytes | None
    topic: str = "t"
    partition: int = 0
    offset: int = 0
    key: bytes | None = b"k"
    headers: tuple[tuple[str, bytes], ...] = ()


def codec(name: str) -> AvroCodec:
    return AvroCodec(registry_client(REGISTRY), name)


# ---- field domains and their edges ------------------------------------------------------

LONG = st.integers(-(2**63), 2**63 - 1)
INT = st.integers(-(2**31), 2**31 - 1)
# Valid values: what a well-behaved producer writes.
GOOD_MS = st.integers(NOW_MS - 43_200_000, NOW_MS + 3_600_000)
GOOD_TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)
GOOD_UUID = st.uuids().map(str)
GOOD_EMAIL = st.emails()
# The edges of each domain.
EPOCH_MS = st.one_of(
    st.sampled_from(
        [
            0,
            -1,
            10**18,  # far beyond year 9999
            NOW_MS * 1000,  # microseconds where milliseconds are meant
            NOW_MS // 1000,  # seconds where milliseconds are meant
            2**63 - 1,
            -(2**63),
            253_402_300_800_000,  # the first millisecond after 9999-12-31
            10**14,  # the year 5138: a valid datetime, not a real event time
            NOW_MS + 30 * 86_400_000,
            NOW_MS + 400 * 86_400_000,
        ]
    ),
    LONG,
)
TEXT = st.one_of(
    GOOD_TEXT.map(lambda t: t + "\x00"),
    st.integers(500, 3000).map(lambda n: "k" * n),  # around the btree key limit
    st.just("x" * 70_000),
    st.just(""),
    st.text(max_size=30),
)
UUID_TEXT = st.one_of(TEXT, st.just(str(uuid.uuid4()) + "x"), st.just("42"))
EMAIL = st.one_of(TEXT, st.just("a@b"), st.just("no-at-sign"))


Domains = tuple[dict[str, st.SearchStrategy[Any]], dict[str, st.SearchStrategy[Any]]]


@st.composite
def records(draw: st.DrawFn, domains: Domains, field: str) -> dict[str, Any]:
    """A valid record whose `field` is at an edge of its domain, and maybe one more field."""
    good, edges = domains
    record = draw(st.fixed_dictionaries(good))
    record[field] = draw(edges[field])
    if draw(st.booleans()):
        other = draw(st.sampled_from(sorted(edges)))
        record[other] = draw(edges[other])
    return record


def order_events() -> Domains:
    item = st.fixed_dictionaries(
        {"sku": GOOD_TEXT, "name": GOOD_TEXT, "quantity": INT, "price": GOOD_TEXT}
    )
    good: dict[str, st.SearchStrategy[Any]] = {
        "event_id": GOOD_UUID,
        "event_type": st.sampled_from(["OrderConfirmed", "OrderCancelled"]),
        "version": st.just(1),
        "occurred_at": GOOD_MS,
        "dedupe_key": st.sampled_from(["", "order-confirmed:1", "password-reset:9"]),
        "order_id": LONG,
        "email": GOOD_EMAIL,
        "customer_name": st.none() | GOOD_TEXT,
        "locale": st.just("en"),
        "total": st.none() | GOOD_TEXT,
        "currency": st.none() | GOOD_TEXT,
        "items": st.lists(item, max_size=2),
        "send_after": st.none() | st.integers(NOW_MS, NOW_MS + 86_400_000),
        "template": st.none() | st.sampled_from(["order_confirmation", "payment_notice"]),
        "reason": st.none() | GOOD_TEXT,
    }
    edges: dict[str, st.SearchStrategy[Any]] = {
        "event_id": UUID_TEXT,
        "event_type": st.sampled_from(["OrderShipped", ""]) | TEXT,
        "version": INT,
        "occurred_at": EPOCH_MS,
        "dedupe_key": TEXT,
        "order_id": st.sampled_from([0, -1, 2**63 - 1, -(2**63)]),
        "email": st.none() | EMAIL,
        "customer_name": TEXT,
        "locale": TEXT,
        "total": TEXT,
        "items": st.lists(
            st.fixed_dictionaries({"sku": TEXT, "name": TEXT, "quantity": INT, "price": TEXT}),
            min_size=1,
            max_size=2,
        ),
        "send_after": EPOCH_MS,
        "template": TEXT,
        "reason": TEXT,
    }
    return good, edges


def ses_events() -> Domains:
    good: dict[str, st.SearchStrategy[Any]] = {
        "event_id": GOOD_UUID,
        "event_type": st.sampled_from(
            ["Bounce", "Complaint", "Delivery", "Send", "Reject", "Open"]
        ),
        "version": st.just(1),
        "occurred_at": GOOD_MS,
        "recipient": GOOD_EMAIL,
        "ses_message_id": GOOD_TEXT,
        "sns_message_id": GOOD_TEXT,
        "campaign_id": st.none() | st.integers(1, 10**6),
        "seq": st.none() | st.integers(1, 10**6),
        "configuration_set": st.none() | GOOD_TEXT,
        "tags": st.dictionaries(GOOD_TEXT, GOOD_TEXT, max_size=2),
        "bounce_type": st.none() | st.sampled_from(["Permanent", "Transient", "Undetermined"]),
        "bounce_sub_type": st.none() | GOOD_TEXT,
        "complaint_type": st.none() | GOOD_TEXT,
        "detail": st.none() | GOOD_TEXT,
        "source": st.sampled_from(["event_publishing", "notification"]),
        "received_at": GOOD_MS,
    }
    edges: dict[str, st.SearchStrategy[Any]] = {
        "event_id": UUID_TEXT,
        "event_type": TEXT,
        "occurred_at": EPOCH_MS,
        "recipient": EMAIL,
        "ses_message_id": TEXT,
        "campaign_id": LONG,
        "seq": LONG,
        "tags": st.dictionaries(TEXT, TEXT, min_size=1, max_size=2),
        "bounce_type": TEXT,
        "detail": TEXT,
        "received_at": EPOCH_MS,
    }
    return good, edges


def unsubscribed_events() -> Domains:
    good: dict[str, st.SearchStrategy[Any]] = {
        "event_id": GOOD_UUID,
        "event_type": st.just("Unsubscribed"),
        "version": st.just(1),
        "occurred_at": GOOD_MS,
        "dedupe_key": GOOD_TEXT,
        "user_id": st.integers(1, 10**9),
        "campaign_id": st.none() | st.integers(1, 10**6),
        "email": GOOD_EMAIL,
        "key_id": GOOD_TEXT,
        "method": st.just("one_click"),
    }
    edges: dict[str, st.SearchStrategy[Any]] = {
        "event_id": UUID_TEXT,
        "occurred_at": EPOCH_MS,
        "user_id": LONG,
        "campaign_id": LONG,
        "email": EMAIL,
        "key_id": TEXT,
    }
    return good, edges


def lifecycle_events() -> Domains:
    good: dict[str, st.SearchStrategy[Any]] = {
        "event_id": GOOD_UUID,
        "event_type": st.sampled_from(["EmailSent", "EmailFailed", "EmailCancelled"]),
        "version": st.just(1),
        "occurred_at": GOOD_MS,
        "dedupe_key": st.just("order-confirmed:1"),
        "ref": st.none() | st.integers(1, 10**9).map(str),
        "mail_status": st.sampled_from(["sent", "failed", "unknown", "cancelled"]),
        "message_id": st.none() | GOOD_TEXT,
        "reason": st.none() | GOOD_TEXT,
        "attempts": st.integers(0, 10),
    }
    edges: dict[str, st.SearchStrategy[Any]] = {
        "event_id": UUID_TEXT,
        "occurred_at": EPOCH_MS,
        "dedupe_key": TEXT,
        "ref": TEXT | LONG.map(str) | st.just("²"),
        "mail_status": TEXT,
        "reason": TEXT,
        "attempts": INT,
    }
    return good, edges


@st.composite
def damaged(draw: st.DrawFn, good: bytes) -> bytes | None:
    """The encoded record as it is, or damaged the ways a topic can hold it."""
    how = draw(st.sampled_from(["as_is"] * 6 + ["truncated", "schema_id", "magic", "garbage"]))
    if how == "truncated":
        return good[: draw(st.integers(0, max(0, len(good) - 1)))]
    if how == "schema_id":
        return struct.pack(">bI", 0, draw(st.integers(10_000, 2**31 - 1))) + good[5:]
    if how == "magic":
        return bytes([draw(st.integers(1, 255))]) + good[1:]
    if how == "garbage":
        return draw(st.binary(max_size=64))
    return good


def storable_text(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" not in value
    if isinstance(value, dict):
        return all(storable_text(k) and storable_text(v) for k, v in value.items())
    if isinstance(value, list):
        return all(storable_text(v) for v in value)
    return True


def a_date(value: datetime | None, ahead_days: int = 1) -> bool:
    """An instant this system can mean: after 2000, at most `ahead_days` after now."""
    latest = datetime.fromtimestamp(NOW_MS / 1000 + ahead_days * 86_400, tz=UTC)
    return value is None or datetime(2000, 1, 1, tzinfo=UTC) <= value.astimezone(UTC) <= latest


# ---- order.events ------------------------------------------------------------------------

ORDER = codec("order_event")


ORDER_DOMAINS = order_events()


@pytest.mark.parametrize("field", sorted(ORDER_DOMAINS[1]))
@PROPERTY
@given(data=st.data())
def test_order_events_are_dead_lettered_or_fit_their_columns(
    field: str, data: st.DataObject
) -> None:
    value = data.draw(damaged(ORDER.encode(data.draw(records(ORDER_DOMAINS, field)))))
    parsed = parse_record(
        ORDER,
        Rec(value),
        now_ms=NOW_MS,
        max_age_s=86_400,
        at_most_once_templates=("payment_notice",),
    )
    if isinstance(parsed, DeadLetter):
        # "unparseable" is the guard for what the field checks did not foresee: none may reach it.
        assert parsed.reason != "unparseable", parsed.detail
        assert parsed.reason and parsed.value == value
        return
    uuid.UUID(parsed.event_id)  # the uuid columns take it
    if isinstance(parsed, CancelMail):
        assert parsed.keys and all(len(k) <= MAX_KEY_CHARS for k in parsed.keys)
        return
    assert len(parsed.dedupe_key) <= MAX_KEY_CHARS and storable_text(parsed.dedupe_key)
    if isinstance(parsed, StaleEvent):
        assert a_date(parsed.occurred_at) and parsed.age_s > 86_400
        return
    assert isinstance(parsed, CreateMail)
    assert a_date(parsed.occurred_at) and a_date(parsed.send_after, ahead_days=366)
    assert len(parsed.template) <= 64
    assert storable_text([parsed.to_email, parsed.template, parsed.data])


def test_cancels_of_any_age_are_applied_through_the_consumer_parse() -> None:
    old = {
        "event_id": str(uuid.uuid4()),
        "event_type": "OrderCancelled",
        "version": 1,
        "occurred_at": NOW_MS - 30 * 86_400_000,
        "dedupe_key": "order-cancelled:7",
        "order_id": 7,
    }
    parsed = parse_record(
        ORDER,
        Rec(ORDER.encode(old)),
        now_ms=NOW_MS,
        max_age_s=86_400,
        at_most_once_templates=(),
    )
    assert isinstance(parsed, CancelMail) and parsed.keys == ["order-confirmed:7"]


# ---- mail.events (feedback agent and the order service's consumer) ------------------------

SES = codec("ses_event")
UNSUBSCRIBED = codec("unsubscribed")
LIFECYCLE = codec("mail_lifecycle")


def feedback_parse(schema: str, codec_: AvroCodec, value: bytes | None) -> FeedbackEffect | str:
    parsed = parse_feedback_record(schema, codec_, Rec(value))
    return parsed.reason if isinstance(parsed, DeadLetter) else parsed


FEEDBACK_DOMAINS = {"ses_event": ses_events(), "unsubscribed": unsubscribed_events()}
FEEDBACK_FIELDS = [(schema, f) for schema, (_, edges) in FEEDBACK_DOMAINS.items() for f in edges]


@pytest.mark.parametrize(("schema", "field"), FEEDBACK_FIELDS)
@PROPERTY
@given(data=st.data())
def test_feedback_records_are_dead_lettered_or_fit_their_columns(
    schema: str, field: str, data: st.DataObject
) -> None:
    codec_ = SES if schema == "ses_event" else UNSUBSCRIBED
    record = data.draw(records(FEEDBACK_DOMAINS[schema], field))
    parsed = feedback_parse(schema, codec_, data.draw(damaged(codec_.encode(record))))
    if isinstance(parsed, str):
        assert parsed and parsed != "bad_record"  # the guard for what the checks missed
        return
    uuid.UUID(parsed.event_id)
    assert 0 < len(parsed.email) <= MAX_KEY_CHARS
    assert storable_text([parsed.email, parsed.source_event])
    assert parsed.campaign_id is None or -(2**63) <= parsed.campaign_id < 2**63
    if parsed.proof is not None:
        assert 0 < parsed.proof.seq < 2**31
        assert 0 <= parsed.proof.occurred_at_ms <= MAX_EPOCH_MS  # to_timestamp() takes it


LIFECYCLE_DOMAINS = lifecycle_events()


@pytest.mark.parametrize("field", sorted(LIFECYCLE_DOMAINS[1]))
@PROPERTY
@given(data=st.data())
def test_lifecycle_records_are_refused_with_value_error_or_fit(
    field: str, data: st.DataObject
) -> None:
    """The order service's consumer dead-letters whatever MailEvent.from_record refuses."""
    record = data.draw(records(LIFECYCLE_DOMAINS, field))
    value = data.draw(damaged(LIFECYCLE.encode(record)))
    try:
        event = MailEvent.from_record(LIFECYCLE.decode(value), NOW_MS)
    except Exception as exc:
        assert isinstance(exc, ValueError | KeyError) or hasattr(exc, "reason")
        return
    uuid.UUID(event.event_id)
    assert a_date(event.occurred_at) and len(event.dedupe_key) <= MAX_KEY_CHARS


# ---- campaign.recipients -----------------------------------------------------------------

DOORBELL = codec("campaign_recipient")


@PROPERTY
@given(
    st.data(),
    LONG,
    st.lists(st.tuples(INT, LONG), min_size=1, max_size=30),
    EPOCH_MS,
)
def test_doorbells_are_dead_lettered_or_name_rows(
    data: st.DataObject, campaign_id: int, members: list[tuple[int, int]], produced_at: int
) -> None:
    value = data.draw(damaged(DoorbellWriter(DOORBELL, campaign_id, produced_at).encode(members)))
    queued = decode_doorbell(DOORBELL, Rec(value))
    if queued.doorbell is None:
        assert queued.error is not None and queued.error.reason
        return
    assert queued.doorbell["campaign_id"] >= 1 and all(0 < s < 2**31 for s in queued.seqs)


# The spellings a uuid column takes besides the canonical one, and near misses of it.
UUID_SPELLINGS = st.one_of(
    GOOD_UUID,
    GOOD_UUID.map(str.upper),
    GOOD_UUID.map(lambda u: "{" + u + "}"),
    GOOD_UUID.map(lambda u: u.replace("-", "")),
    GOOD_UUID.map(lambda u: "urn:uuid:" + u),
    st.tuples(GOOD_UUID, st.integers(0, 35), st.sampled_from("gz-_ \x00G")).map(
        lambda t: t[0][: t[1]] + t[2] + t[0][t[1] + 1 :]
    ),
    st.text(alphabet="0123456789abcdef-", min_size=30, max_size=40),
    UUID_TEXT,
)


@given(UUID_SPELLINGS)
def test_an_event_id_passes_exactly_when_it_is_a_uuid(value: str) -> None:
    try:
        uuid.UUID(value)
        parses = len(value) <= 64
    except ValueError:
        parses = False
    assert (uuid_problem(value) is None) == parses, value


@pytest.mark.parametrize(
    ("record", "problem"),
    [
        ({"a": "x", "n": 1, "f": 0.5, "b": True, "z": None, "t": {"k": "v"}}, None),
        ({"a": "x\x00"}, "a: contains NUL"),
        ({"a\x00": "x"}, "value: contains NUL"),
        ({"tags": {"k\x00": "v"}}, "tags: contains NUL"),
        ({"tags": {"k": "v\x00"}}, "tags.k: contains NUL"),
        ({"list": ["ok", "no\x00"]}, "list[1]: contains NUL"),
        ({"a": "x" * 70_000}, "a: 70000 characters, at most 65536"),
        ({"k" * 70_000: 1}, "value: 70000 characters, at most 65536"),
    ],
)
def test_text_problem_finds_any_string_a_column_cannot_hold(
    record: dict[str, Any], problem: str | None
) -> None:
    assert text_problem(record) == problem
