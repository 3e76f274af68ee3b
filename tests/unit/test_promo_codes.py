"""Promo codes, the pure parts: pool files, the pattern language, drawing, pool rules."""

from __future__ import annotations

import inspect
import secrets

import pytest

from streams.rules.promo_codes import (
    ALPHABET,
    MAX_CODE_LENGTH,
    SPARSENESS,
    PatternError,
    PoolFileError,
    check_count,
    draw_codes,
    parse_pattern,
    pool_refusal,
    read_pool_file,
)


def test_pool_file_codes_in_order_whitespace_and_blank_lines_ignored() -> None:
    assert read_pool_file(["  AB-1\n", "\n", "cd2\r\n", "   \n", "E\n"]) == ["AB-1", "cd2", "E"]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "holds no code"),
        (["\n", "  \n"], "holds no code"),
        (["A\n", "B\n", "A\n"], "1 duplicate(s): line 3: 'A' repeats line 1"),
        (["X" * (MAX_CODE_LENGTH + 1)], f"line 1: {MAX_CODE_LENGTH + 1} characters"),
        (["ok\n", "two words\n"], "line 2: 'two words' has characters other than printable"),
        (["ok\n", "café\n"], "line 2: 'café'"),
    ],
)
def test_a_bad_pool_file_is_refused_whole(lines: list[str], message: str) -> None:
    with pytest.raises(PoolFileError, match="nothing imported") as caught:
        read_pool_file(lines)
    assert message in str(caught.value)


def test_pool_file_error_lists_a_few_and_counts_the_rest() -> None:
    lines = [f"C{i % 3}\n" for i in range(20)]
    with pytest.raises(PoolFileError) as caught:
        read_pool_file(lines)
    assert "17 duplicate(s)" in str(caught.value)
    assert "(and 12 more)" in str(caught.value)


def test_a_code_of_max_length_is_accepted() -> None:
    assert read_pool_file(["Z" * MAX_CODE_LENGTH]) == ["Z" * MAX_CODE_LENGTH]


def test_pattern_literals_and_runs() -> None:
    pattern = parse_pattern("SALE25-{8}")
    assert pattern.parts == ("SALE25-", 8)
    assert pattern.length == 15
    assert pattern.space == len(ALPHABET) ** 8
    code = pattern.draw()
    assert code.startswith("SALE25-") and len(code) == 15
    assert set(code[7:]) <= set(ALPHABET)
    assert parse_pattern("{4}-{4}-{4}").parts == (4, "-", 4, "-", 4)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("SALE", "no random run"),
        ("", "no random run"),
        ("A {4}", "unexpected ' ' at position 2"),
        ("{0}", "must be 1..32"),
        ("{33}", "must be 1..32"),
        ("{4", "unexpected '{'"),
        ("X" * 60 + "{8}", "68 characters"),
    ],
)
def test_bad_patterns_say_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(PatternError) as caught:
        parse_pattern(text)
    assert message in str(caught.value)


def test_alphabet_leaves_out_lookalikes() -> None:
    assert not set("0O1IL5S8B2ZUV") & set(ALPHABET)
    assert len(set(ALPHABET)) == len(ALPHABET)


def test_count_needs_a_sparse_pattern() -> None:
    pattern = parse_pattern("{4}")  # 279,841 codes
    check_count(pattern, pattern.space // SPARSENESS)
    with pytest.raises(PatternError, match="lengthen a random run"):
        check_count(pattern, pattern.space // SPARSENESS + 1)
    with pytest.raises(PatternError, match="at least 1"):
        check_count(pattern, 0)


def test_drawn_codes_are_distinct_and_avoid_taken_ones() -> None:
    pattern = parse_pattern("{1}")  # 23 codes: collisions on almost every draw
    taken = list(ALPHABET[:10])
    codes = draw_codes(pattern, 13, taken=taken)
    assert len(codes) == len(set(codes)) == 13
    assert set(codes) == set(ALPHABET[10:])
    with pytest.raises(PatternError):
        draw_codes(pattern, 14, taken=taken)


def test_codes_are_drawn_with_the_secrets_module() -> None:
    """Predictable codes can be guessed: the default source is the OS's CSPRNG."""
    assert inspect.signature(draw_codes).parameters["choice"].default is secrets.choice
    assert inspect.signature(parse_pattern("{2}").draw).parameters["choice"].default is (
        secrets.choice
    )


@pytest.mark.parametrize(
    ("status", "has_pool", "allowed"),
    [
        ("draft", False, True),
        ("draft", True, True),
        ("sending", True, True),
        ("paused", True, True),
        ("snapshotting", True, True),
        ("sending", False, False),
        ("paused", False, False),
        ("done", True, False),
        ("cancelled", True, False),
        ("failed", False, False),
    ],
)
def test_pool_rules(status: str, has_pool: bool, allowed: bool) -> None:
    assert (pool_refusal(7, status, has_pool) is None) is allowed


def test_the_bound_code_reaches_the_template_data() -> None:
    from sinks.recipient_store import ClaimedRecipient
    from streams.sender import replacement_data

    with_code = ClaimedRecipient(1, 2, 3, "a@x.test", "Lan", 1, "SALE-7KQ4")
    assert replacement_data(with_code) == {
        "first_name": "Lan",
        "user_id": 3,
        "promo_code": "SALE-7KQ4",
    }
    without = ClaimedRecipient(1, 2, 3, "a@x.test", None, 1)
    assert replacement_data(without) == {"first_name": "there", "user_id": 3}
