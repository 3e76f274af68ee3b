"""One-click unsubscribe tokens: round trip, tamper resistance, hostile input, key rotation."""

from __future__ import annotations

import base64
import re

import pytest

from streams.rules.unsubscribe_token import (
    MAX_TOKEN_CHARS,
    TokenKeys,
    UnsubscribeClaim,
    _mac,
    list_unsubscribe_headers,
    make_token,
    parse_keys,
    read_token,
)

SECRET_1 = bytes(range(32))
SECRET_2 = bytes(range(100, 132))
B64_1 = base64.b64encode(SECRET_1).decode()
B64_2 = base64.b64encode(SECRET_2).decode()
KEYS = TokenKeys("k1", {"k1": SECRET_1})
ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
BIGINT = 2**63 - 1


def _encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.mark.parametrize(
    ("user_id", "campaign_id"),
    [(1, 42), (0, None), (0, 0), (971_696, 7), (BIGINT, BIGINT - 1), (2**31, None)],
)
def test_round_trip(user_id: int, campaign_id: int | None) -> None:
    token = make_token(KEYS, user_id, campaign_id)
    assert re.fullmatch(r"[A-Za-z0-9_-]+", token)  # URL-safe, no padding
    assert len(token) <= MAX_TOKEN_CHARS
    assert read_token(KEYS, token) == UnsubscribeClaim(user_id, campaign_id, "k1")
    assert make_token(KEYS, user_id, campaign_id) == token  # deterministic


def test_typical_token_is_compact() -> None:
    assert len(make_token(KEYS, 971_696, 42)) <= 36


@pytest.mark.parametrize(
    ("user_id", "campaign_id"), [(-1, 1), (1, -1), (BIGINT + 1, 1), (1, BIGINT)]
)
def test_ids_out_of_range_are_refused(user_id: int, campaign_id: int) -> None:
    with pytest.raises(ValueError):
        make_token(KEYS, user_id, campaign_id)


def test_changing_any_character_fails() -> None:
    token = make_token(KEYS, 12345, 42)
    for i, char in enumerate(token):
        for other in ALPHABET:
            if other != char:
                assert read_token(KEYS, token[:i] + other + token[i + 1 :]) is None, (i, other)


def test_flipping_any_bit_fails() -> None:
    raw = base64.urlsafe_b64decode(make_token(KEYS, 12345, None) + "==")
    for i in range(len(raw)):
        for bit in range(8):
            tampered = bytearray(raw)
            tampered[i] ^= 1 << bit
            assert read_token(KEYS, _encode(bytes(tampered))) is None, (i, bit)


def test_truncations_and_extensions_fail() -> None:
    token = make_token(KEYS, 12345, 42)
    for n in range(len(token)):
        assert read_token(KEYS, token[:n]) is None
    for suffix in ("A", "AA", "AAAA", "=", "==", " ", "\n", "%3D"):
        assert read_token(KEYS, token + suffix) is None
    assert read_token(KEYS, " " + token) is None


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "=",
        "A",
        "AAAA",
        "A" * MAX_TOKEN_CHARS,
        "A" * 10_000,
        "!!!!",
        "é" * 20,
        "\x00" * 30,
        "AQJrMQ",
        "../../etc/passwd",
        "A\u0660BC",
        "😀" * 8,
    ],
)
def test_garbage_reads_as_none(garbage: str) -> None:
    assert read_token(KEYS, garbage) is None


def test_non_strings_read_as_none() -> None:
    token = make_token(KEYS, 1, 2)
    for value in (None, 5, token.encode(), [token]):
        assert read_token(KEYS, value) is None  # type: ignore[arg-type]


def _forge(payload: bytes, secret: bytes = SECRET_1) -> str:
    """A correctly MACed token around an arbitrary payload (only the key holder can do this)."""
    return _encode(payload + _mac(secret, payload))


def test_only_canonical_encodings_verify_even_with_a_valid_mac() -> None:
    head = bytes([1, 2]) + b"k1"
    assert read_token(KEYS, _forge(head + b"\x05\x00")) == UnsubscribeClaim(5, None, "k1")
    assert read_token(KEYS, _forge(head + b"\x85\x00\x00")) is None  # overlong varint
    assert read_token(KEYS, _forge(head + b"\x05\x00\x00")) is None  # trailing byte
    assert read_token(KEYS, _forge(head + b"\x05")) is None  # campaign missing
    assert read_token(KEYS, _forge(head + b"\xff" * 9 + b"\x00")) is None  # > 63 bits
    assert read_token(KEYS, _forge(bytes([2, 2]) + b"k1\x05\x00")) is None  # unknown version
    assert read_token(KEYS, _forge(bytes([1, 3]) + b"k1\x05\x00")) is None  # kid length lies
    # Spare base64 bits set: same bytes, different spelling.
    token = make_token(KEYS, 12345, 42)
    assert len(token) % 4 != 0
    spare = token[:-1] + ALPHABET[ALPHABET.index(token[-1]) | 1]
    assert spare != token and read_token(KEYS, spare) is None


def test_rotation() -> None:
    old_keys = parse_keys(f"k1:{B64_1}")
    old_token = make_token(old_keys, 7, 42)
    rotated = parse_keys(f"k2:{B64_2},k1:{B64_1}")
    assert rotated.current_kid == "k2"
    assert read_token(rotated, old_token) == UnsubscribeClaim(7, 42, "k1")  # old mail still works
    new_token = make_token(rotated, 7, 42)
    assert new_token != old_token
    assert read_token(rotated, new_token) == UnsubscribeClaim(7, 42, "k2")
    assert read_token(old_keys, new_token) is None  # unknown kid
    retired = parse_keys(f"k2:{B64_2}")
    assert read_token(retired, old_token) is None
    same_kid_other_secret = TokenKeys("k1", {"k1": SECRET_2})
    assert read_token(same_kid_other_secret, old_token) is None


def test_parse_keys_accepts_both_base64_alphabets_and_spacing() -> None:
    urlsafe = base64.urlsafe_b64encode(b"\xfb\xff" * 16).decode().rstrip("=")
    keys = parse_keys(f" k2:{urlsafe} , k1:{B64_1}\n")
    assert dict(keys.keys) == {"k2": b"\xfb\xff" * 16, "k1": SECRET_1}
    assert keys.current_kid == "k2"


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "k1",
        f"k1:{B64_1},",
        f":{B64_1}",
        "k1:not*base64",
        f"k1:{base64.b64encode(b'short').decode()}",
        f"k1:{B64_1},k1:{B64_2}",
        f"k 1:{B64_1}",
        f"{'k' * 17}:{B64_1}",
    ],
)
def test_parse_keys_refuses_bad_specs(spec: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_keys(spec)
    assert B64_1 not in str(info.value) and B64_2 not in str(info.value)


def test_secrets_stay_out_of_repr_and_keys_are_frozen() -> None:
    keys = parse_keys(f"k1:{B64_1}")
    assert B64_1 not in repr(keys) and repr(SECRET_1) not in repr(keys)
    with pytest.raises(TypeError):
        keys.keys["k9"] = SECRET_2  # type: ignore[index]
    with pytest.raises(ValueError, match="no key"):
        TokenKeys("k2", {"k1": SECRET_1})


def test_list_unsubscribe_headers() -> None:
    token = make_token(KEYS, 1, 42)
    expected = {
        "List-Unsubscribe": f"<https://mail.example.org/u/{token}>",
        "List-Unsubscribe-Post": "List-Unsubscribe=One-Click",
    }
    assert list_unsubscribe_headers("https://mail.example.org", token) == expected
    assert list_unsubscribe_headers("https://mail.example.org/", token) == expected
    prefixed = list_unsubscribe_headers("https://example.org/mail/", token)
    assert prefixed["List-Unsubscribe"] == f"<https://example.org/mail/u/{token}>"
    local = list_unsubscribe_headers("http://127.0.0.1:8080", token, allow_http=True)
    assert local["List-Unsubscribe"] == f"<http://127.0.0.1:8080/u/{token}>"


@pytest.mark.parametrize(
    "base_url",
    [
        "http://mail.example.org",  # RFC 8058 wants HTTPS
        "mail.example.org",
        "https://",
        "https://mail.example.org/?a=b",
        "https://mail.example.org/#x",
        "https://mail.example.org/a b",
        "https://mail.example.org/>, <mailto:evil@example.com",
        "https://mail.example.org\r\nBcc: evil@example.com",
    ],
)
def test_headers_refuse_bad_base_urls(base_url: str) -> None:
    with pytest.raises(ValueError):
        list_unsubscribe_headers(base_url, make_token(KEYS, 1, 42))


def test_headers_refuse_non_tokens() -> None:
    for token in ("", "a b", "a>b", "x" * (MAX_TOKEN_CHARS + 1)):
        with pytest.raises(ValueError):
            list_unsubscribe_headers("https://mail.example.org", token)
