"""Address normalisation, validation and simulator detection."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.rules.addresses import (
    SIMULATOR_DOMAIN,
    _problem,
    is_simulator_address,
    is_valid_email,
    normalise_email,
)


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        ("  Jane.Doe@Example.COM \n", "jane.doe@example.com"),
        ("user+Promo@Gmail.com", "user+promo@gmail.com"),
        ("first.last@example.com", "first.last@example.com"),
        ("", ""),
    ],
)
def test_normalise_email(raw: str, normal: str) -> None:
    assert normalise_email(raw) == normal


def test_normalise_is_idempotent() -> None:
    once = normalise_email(" A.B+C@Sub.Example.ORG ")
    assert normalise_email(once) == once


@pytest.mark.parametrize(
    "addr",
    [
        "user@example.com",
        "User.Name@Example.COM",
        "user+tag@mail.example.co.uk",
        "o'brien@example.ie",
        "a!#$%&'*+-/=?^_`{|}~b@example.com",
        "x@a-b.example",
        "user@xn--bcher-kva.example",
        "user@example.xn--p1ai",
        "1234@123.example.com",
        "success@simulator.amazonses.com",
        "a" * 64 + "@example.com",
        "u@" + ".".join(["a" * 63] * 3) + ".com",
    ],
)
def test_valid_addresses(addr: str) -> None:
    assert is_valid_email(addr) is None


@pytest.mark.parametrize(
    ("addr", "reason"),
    [
        ("", "empty"),
        (" user@example.com", "whitespace"),
        ("user@example.com ", "whitespace"),
        ("us er@example.com", "whitespace"),
        ("user@exa\tmple.com", "whitespace"),
        ("user\x00@example.com", "control_char"),
        ("user\x7f@example.com", "control_char"),
        ("jürgen@example.de", "non_ascii"),
        ("user@bücher.example", "non_ascii"),
        ("a" * 64 + "@" + "b" * 63 + "." + "c" * 63 + "." + "d" * 63 + ".com", "too_long"),
        ("user.example.com", "no_at"),
        ("a@b@example.com", "multiple_at"),
        ('"a@b"@example.com', "multiple_at"),
        ("@example.com", "empty_local"),
        ("a" * 65 + "@example.com", "local_too_long"),
        (".user@example.com", "bad_local"),
        ("user.@example.com", "bad_local"),
        ("us..er@example.com", "bad_local"),
        ('"quoted"@example.com', "bad_local"),
        ("a,b@example.com", "bad_local"),
        ("a(comment)@example.com", "bad_local"),
        ("user@", "bad_domain"),
        ("user@localhost", "bad_domain"),
        ("user@example..com", "bad_domain"),
        ("user@.example.com", "bad_domain"),
        ("user@example.com.", "bad_domain"),
        ("user@-example.com", "bad_domain"),
        ("user@example-.com", "bad_domain"),
        ("user@exa_mple.com", "bad_domain"),
        ("user@[192.168.0.1]", "bad_domain"),
        ("user@192.168.0.1", "bad_domain"),
        ("user@example.c", "bad_domain"),
        ("user@example.c0m", "bad_domain"),
        ("user@" + "a" * 64 + ".com", "bad_domain"),
    ],
)
def test_invalid_addresses(addr: str, reason: str) -> None:
    assert is_valid_email(addr) == reason


def test_normalised_address_with_spaces_becomes_valid() -> None:
    assert is_valid_email(normalise_email("  Jane@Example.com ")) is None


@pytest.mark.parametrize(
    ("addr", "expected"),
    [
        ("success@simulator.amazonses.com", True),
        ("bounce@simulator.amazonses.com", True),
        ("Complaint@Simulator.AmazonSES.com", True),
        (" ooto@simulator.amazonses.com ", True),
        ("suppressionlist@simulator.amazonses.com", True),
        ("user@example.com", False),
        ("simulator.amazonses.com", False),
        ("user@notsimulator.amazonses.com", False),
        ("user@simulator.amazonses.com.evil.example", False),
        ("", False),
    ],
)
def test_is_simulator_address(addr: str, expected: bool) -> None:
    assert is_simulator_address(addr) is expected
    assert SIMULATOR_DOMAIN == "simulator.amazonses.com"


# Characters that decide the checks: atext, dots, hyphens, the at sign, a space, a control
# character, a non-ASCII letter, and the letters of "xn--".
_TRICKY = "aZx9n.-@ _+'\x01é"
_parts = st.text(alphabet=_TRICKY, max_size=70)


@given(st.builds(lambda local, domain, tld: f"{local}@{domain}.{tld}", _parts, _parts, _parts))
@settings(max_examples=3000, deadline=None)
def test_the_fast_path_accepts_only_what_the_full_check_accepts(addr: str) -> None:
    assert is_valid_email(addr) == _problem(addr)


@given(st.text(alphabet=_TRICKY, max_size=300))
@settings(max_examples=2000, deadline=None)
def test_the_fast_path_agrees_on_any_string(addr: str) -> None:
    assert is_valid_email(addr) == _problem(addr)


@pytest.mark.parametrize(
    "addr",
    [
        "a" * 64 + "@example.com",
        "a" * 65 + "@example.com",
        "a@" + "b" * 63 + ".com",
        "a@" + "b" * 64 + ".com",
        "a@example.xn--p1ai",
        "a@example.xn--",
        "a@example.xn--p1ai-",
        "a@example.XN--p1ai",
        "a@-example.com",
        "a@example-.com",
        ".a@example.com",
        "a@example." + "c" * 63,
        "a@example." + "c" * 64,
        "x@" + ".".join(["d" * 60] * 4) + ".com",
    ],
)
def test_the_fast_path_at_the_length_limits(addr: str) -> None:
    assert is_valid_email(addr) == _problem(addr)
