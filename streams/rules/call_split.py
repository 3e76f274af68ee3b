"""Isolating the entries SES refused a whole call for (pure).

SES validates a SendBulkEmail call before it sends any of it: one destination it cannot use
(an address our check let through, an unverified recipient in the sandbox) makes it refuse all
the call's entries with one error, and nothing is sent (`streams.rules.outcomes.is_refused_unsent`).
`Bisection` plans the calls that find the culprits: a refused call is split in two and each
half sent again; a refused single entry is a culprit and fails with SES's message; a half SES
answers is answered entry by entry, as any call. Only refused calls are sent again, and a
refused call sent nothing, so no recipient is ever sent twice.

Cost in calls for n entries: 1 when nothing is refused; at most 2·k·⌈log2 n⌉ + 1 with k
culprits (50 entries, 1 culprit: 13); at most 2n − 1 whatever happens (99 for 50), which is what
a refusal that has nothing to do with the entries (say, a From address SES rejects) costs
before every entry ends failed with SES's message.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class Bisection(Generic[T]):
    """The calls left to make for `items`, first half first (request order)."""

    def __init__(self, items: Sequence[T]) -> None:
        self._todo: list[list[T]] = [list(items)] if items else []  # a stack: next call last
        self.culprits: list[tuple[T, str]] = []  # (entry, SES's reason), in request order
        self.calls = 0  # calls handed out so far

    def next_call(self) -> list[T] | None:
        """The entries of the next call, or None when every entry has been placed."""
        if not self._todo:
            return None
        self.calls += 1
        return self._todo.pop()

    def refused(self, call: Sequence[T], reason: str) -> None:
        """SES refused `call` whole, sending nothing: split it, or, for one entry, that entry
        is a culprit."""
        if len(call) == 1:
            self.culprits.append((call[0], reason))
            return
        mid = (len(call) + 1) // 2
        self._todo.append(list(call[mid:]))
        self._todo.append(list(call[:mid]))

    def remaining(self) -> list[T]:
        """Entries not yet handed out in any call (what the caller holds back if it stops),
        in request order. Afterwards there is nothing left to call."""
        left = [item for call in reversed(self._todo) for item in call]
        self._todo.clear()
        return left
