"""A dead letter keeps the record's own headers, and a replay gives back exactly those."""

from __future__ import annotations

from producers.dlq import DLQ_HEADERS, DeadLetter, record_headers
from producers.dlq_replay import REPLAY_HEADER, Letter, replay_headers

OWN = (("flashsend.schema", b"ses_event"), ("event_id", b"e-1"), ("empty", None))


def test_record_headers_reads_faust_lists_mappings_and_none() -> None:
    assert record_headers(None) == ()
    assert record_headers([]) == ()
    assert record_headers([("a", b"1"), ("b", None)]) == (("a", b"1"), ("b", None))
    assert record_headers({"a": b"1", "n": "text"}) == (("a", b"1"), ("n", b"text"))


def test_a_dead_letter_puts_the_records_headers_before_its_own() -> None:
    letter = DeadLetter("mail.events", 3, 17, b"k", b"v", "bad_record", "x", OWN)
    headers = letter.headers()
    assert headers[:3] == list(OWN)
    assert {k for k, _ in headers[3:]} == DLQ_HEADERS


def test_a_replay_sends_the_records_headers_back_and_one_replay_mark() -> None:
    written = DeadLetter("mail.events", 3, 17, b"k", b"v", "bad_record", "x", OWN).headers()
    # As read back from the DLQ, after an earlier replay had dead-lettered it again:
    raw = tuple((k, v if v is None or isinstance(v, bytes) else v.encode()) for k, v in written)
    raw += ((REPLAY_HEADER, b"flashsend.dlq@0:3"),)
    letter = Letter(0, 9, b"k", b"v", raw)
    assert replay_headers(letter, "flashsend.dlq") == [
        *OWN,
        (REPLAY_HEADER, b"flashsend.dlq@0:9"),
    ]


def test_the_dead_letter_of_a_consumed_record_keeps_where_it_came_from() -> None:
    from types import SimpleNamespace

    rec = SimpleNamespace(
        topic="orders", partition=4, offset=99, key=b"k", value=b"v", headers=list(OWN)
    )
    letter = DeadLetter.of(rec, "bad_record", "why")
    assert (letter.topic, letter.partition, letter.offset) == ("orders", 4, 99)
    assert (letter.key, letter.value, letter.reason, letter.detail) == (
        b"k",
        b"v",
        "bad_record",
        "why",
    )
    assert letter.original_headers == OWN
    assert (
        DeadLetter.of(SimpleNamespace(**{**vars(rec), "headers": None}), "r").original_headers == ()
    )
