"""The Firehose delivery request, read and answered (pure)."""

from __future__ import annotations

import gzip
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from producers.firehose_endpoint import (
    MAX_BODY_BYTES,
    FirehoseRefused,
    answer,
    check_access_key,
    parse_request,
    request_body,
)


@given(st.lists(st.text(max_size=200), max_size=30), st.booleans())
def test_what_firehose_sends_is_read_back_record_for_record(texts: list[str], gz: bool) -> None:
    body = request_body("req-1", [t.encode() for t in texts], timestamp_ms=1)
    request = parse_request(gzip.compress(body) if gz else body, "gzip" if gz else "")
    assert request.request_id == "req-1"
    assert request.data == texts


def test_a_record_that_is_not_base64_text_is_kept_as_none_beside_the_others() -> None:
    body = json.loads(request_body("r", [b"a", b"b"]))
    body["records"][1:1] = [{"data": "%%%"}, {"data": "/w=="}, {"nodata": 1}, "x"]  # /w== = 0xff
    assert parse_request(json.dumps(body).encode()).data == ["a", None, None, None, None, "b"]


@pytest.mark.parametrize(
    ("body", "encoding", "status"),
    [
        (b"not json", "", 400),
        (b"[]", "", 400),
        (b'{"records": []}', "", 400),
        (b'{"requestId": "", "records": []}', "", 400),
        (b'{"requestId": "r"}', "", 400),
        (b'{"requestId": "r", "records": {}}', "", 400),
        (b"not gzip", "gzip", 400),
        (b'{"requestId": "r", "records": []}', "br", 400),
        (gzip.compress(b" " * (MAX_BODY_BYTES * 4 + 1)), "gzip", 413),
    ],
)
def test_a_body_that_is_not_a_delivery_request_is_refused(
    body: bytes, encoding: str, status: int
) -> None:
    with pytest.raises(FirehoseRefused) as refused:
        parse_request(body, encoding)
    assert refused.value.status == status


def test_an_empty_batch_is_a_request() -> None:
    assert parse_request(b'{"requestId": "r", "records": []}').data == []


@pytest.mark.parametrize(
    ("given_key", "keys", "ok"),
    [
        ("k1", ("k1",), True),
        ("k2", ("k1", "k2"), True),  # a rotation: the next key is taken too
        ("k1x", ("k1",), False),
        ("", ("k1",), False),
        ("k1", (), False),  # none configured: the route is closed
    ],
)
def test_only_a_configured_key_is_taken(given_key: str, keys: tuple[str, ...], ok: bool) -> None:
    if ok:
        check_access_key(given_key, keys)
        return
    with pytest.raises(FirehoseRefused) as refused:
        check_access_key(given_key, keys)
    assert refused.value.status == 401


def test_the_answer_echoes_the_request_id_and_carries_the_error() -> None:
    ok = json.loads(answer("abc"))
    assert (
        ok["requestId"] == "abc" and isinstance(ok["timestamp"], int) and "errorMessage" not in ok
    )
    assert json.loads(answer("abc", "broker down"))["errorMessage"] == "broker down"
