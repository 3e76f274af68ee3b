"""Bisection of a call SES refused whole: which calls are made, who ends failed, at what cost."""

from __future__ import annotations

import math
import random

import pytest

from streams.rules.call_split import Bisection


def run(items: list[int], refuses: set[int]) -> tuple[list[list[int]], list[int], list[int]]:
    """Drive a Bisection against an SES that refuses any call holding an entry of `refuses`
    (as the stand-in and SES do): every call made, the entries sent, the culprits."""
    split = Bisection(items)
    calls: list[list[int]] = []
    sent: list[int] = []
    while (call := split.next_call()) is not None:
        calls.append(call)
        bad = [i for i in call if i in refuses]
        if bad:
            split.refused(call, f"Illegal address: {bad[0]}")
        else:
            sent += call
    assert split.calls == len(calls)
    return calls, sent, [item for item, _ in split.culprits]


def test_nothing_refused_is_one_call() -> None:
    calls, sent, culprits = run(list(range(50)), set())
    assert calls == [list(range(50))]
    assert sent == list(range(50)) and culprits == []


def test_one_bad_entry_fails_alone_with_its_reason() -> None:
    split = Bisection(list(range(50)))
    call = split.next_call()
    assert call is not None
    while call is not None:
        if 17 in call:
            split.refused(call, "BadRequestException: Illegal address: 'x' in Destination.")
        call = split.next_call()
    assert split.culprits == [(17, "BadRequestException: Illegal address: 'x' in Destination.")]
    assert split.calls == 13  # 1 + 2 per level: 50 → 25 → 13 → 7 → 4 → 2 → 1


def test_halves_go_in_request_order() -> None:
    calls, sent, _ = run(list(range(8)), {0})
    assert calls == [list(range(8)), [0, 1, 2, 3], [0, 1], [0], [1], [2, 3], [4, 5, 6, 7]]
    assert sent == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("seed", range(300))
def test_every_good_entry_is_sent_exactly_once_and_only_bad_ones_fail(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 50)
    items = list(range(n))
    refuses = set(rng.sample(items, rng.choice([0, 1, 1, 2, 3, rng.randint(0, n)])))
    calls, sent, culprits = run(items, refuses)
    assert sorted(sent) == sorted(set(items) - refuses)
    assert len(sent) == len(set(sent)), "an entry went out twice"
    assert sorted(culprits) == sorted(refuses)
    # Each entry is in at most one call per level of splitting, and only refused calls split.
    assert len(calls) <= 2 * n - 1
    if refuses:
        assert len(calls) <= 2 * len(refuses) * math.ceil(math.log2(n) if n > 1 else 0) + 1


def test_a_refusal_of_everything_costs_2n_minus_1_calls() -> None:
    calls, sent, culprits = run(list(range(50)), set(range(50)))
    assert len(calls) == 99 and sent == [] and culprits == list(range(50))


def test_remaining_hands_back_what_was_never_called_in_order() -> None:
    split = Bisection(list(range(10)))
    first = split.next_call()
    assert first is not None
    split.refused(first, "no")
    assert split.next_call() == [0, 1, 2, 3, 4]
    assert split.remaining() == [5, 6, 7, 8, 9]
    assert split.next_call() is None


def test_no_entries_no_call() -> None:
    assert Bisection([]).next_call() is None
