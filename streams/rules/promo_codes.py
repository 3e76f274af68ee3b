"""Promo codes (pure): read a pool file, parse a generation pattern, draw codes.

A pool file holds one code per line. Surrounding whitespace is ignored and blank lines are
skipped; every other line is a code of 1..MAX_CODE_LENGTH printable ASCII characters without
spaces. A file with no code, a code too long or with other characters, or a code twice is
refused as a whole (`PoolFileError` names the lines), so a bad file changes nothing.

The pattern language of `promo generate --pattern`: literal text with runs of random
characters written `{N}` (N from 1 to 32). Each random character is drawn with `secrets` from
ALPHABET, which leaves out the characters people confuse (0/O, 1/I/L, 5/S, 8/B, 2/Z, U/V).
Literals may be letters, digits, `-`, `_` and `.`.

    {10}            7KQ4HX9MRC
    SALE25-{8}      SALE25-WD3JT6PA
    {4}-{4}-{4}     HM4R-X7QT-9CWE
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

MAX_CODE_LENGTH = 64
MAX_RUN = 32
ALPHABET = "34679ACDEFGHJKMNPQRTWXY"
DEFAULT_PATTERN = "{10}"
# The pattern must allow this many times more codes than are drawn: a guessed code is then
# valid with a probability of at most 1/SPARSENESS, and collisions stay rare enough for
# drawing again to end quickly.
SPARSENESS = 1000

_CODE = re.compile(r"[\x21-\x7e]+")
_TOKEN = re.compile(r"\{(\d+)\}|([A-Za-z0-9_.-]+)")
_LISTED = 5  # offending lines named in an error


class PoolFileError(ValueError):
    """The pool file cannot be imported as it is (nothing was imported)."""


class PatternError(ValueError):
    """The --pattern is not in the pattern language."""


def read_pool_file(lines: Iterable[str]) -> list[str]:
    """The codes of a pool file, in file order; PoolFileError for a bad file."""
    codes: list[str] = []
    first_line: dict[str, int] = {}
    problems: list[str] = []
    duplicates: list[str] = []
    for number, raw in enumerate(lines, start=1):
        code = raw.strip()
        if not code:
            continue
        if len(code) > MAX_CODE_LENGTH:
            problems.append(f"line {number}: {len(code)} characters (at most {MAX_CODE_LENGTH})")
        elif not _CODE.fullmatch(code):
            problems.append(f"line {number}: {code!r} has characters other than printable ASCII")
        elif code in first_line:
            duplicates.append(f"line {number}: {code!r} repeats line {first_line[code]}")
        else:
            first_line[code] = number
            codes.append(code)
    if problems or duplicates:
        bad = problems + duplicates
        more = f" (and {len(bad) - _LISTED} more)" if len(bad) > _LISTED else ""
        kinds = []
        if problems:
            kinds.append(f"{len(problems)} malformed code(s)")
        if duplicates:
            kinds.append(f"{len(duplicates)} duplicate(s)")
        raise PoolFileError(
            f"{' and '.join(kinds)}: {'; '.join(bad[:_LISTED])}{more}; nothing imported"
        )
    if not codes:
        raise PoolFileError("the file holds no code (one code per line); nothing imported")
    return codes


@dataclass(frozen=True)
class Pattern:
    """A parsed pattern: literal text and random runs, in order."""

    parts: tuple[str | int, ...]  # a str is literal, an int a run of that many random chars

    @property
    def length(self) -> int:
        return sum(p if isinstance(p, int) else len(p) for p in self.parts)

    @property
    def space(self) -> int:
        """How many distinct codes the pattern can make."""
        return int(len(ALPHABET) ** sum(p for p in self.parts if isinstance(p, int)))

    def draw(self, choice: Callable[[str], str] = secrets.choice) -> str:
        return "".join(
            "".join(choice(ALPHABET) for _ in range(p)) if isinstance(p, int) else p
            for p in self.parts
        )


def parse_pattern(text: str) -> Pattern:
    """The pattern `text` (see the module docstring); PatternError says what is wrong."""
    parts: list[str | int] = []
    at = 0
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None:
            raise PatternError(
                f"pattern {text!r}: unexpected {text[at]!r} at position {at + 1}; write random "
                "runs as {N} and literals with letters, digits, '-', '_' and '.'"
            )
        run, literal = match.groups()
        if run is not None:
            n = int(run)
            if not 1 <= n <= MAX_RUN:
                raise PatternError(f"pattern {text!r}: a run {{{n}}} must be 1..{MAX_RUN} long")
            parts.append(n)
        else:
            parts.append(literal)
        at = match.end()
    pattern = Pattern(tuple(parts))
    if not any(isinstance(p, int) for p in parts):
        raise PatternError(f"pattern {text!r} has no random run such as {{8}}")
    if pattern.length > MAX_CODE_LENGTH:
        raise PatternError(
            f"pattern {text!r} makes codes of {pattern.length} characters "
            f"(at most {MAX_CODE_LENGTH})"
        )
    return pattern


def check_count(pattern: Pattern, count: int) -> None:
    """PatternError unless `pattern` is sparse enough for `count` codes."""
    if count < 1:
        raise PatternError(f"--count must be at least 1, not {count}")
    if pattern.space < count * SPARSENESS:
        raise PatternError(
            f"the pattern makes {pattern.space:,} distinct codes; {count:,} codes need at least "
            f"{count * SPARSENESS:,} ({SPARSENESS:,} per code, so a guess rarely hits one): "
            "lengthen a random run"
        )


def draw_codes(
    pattern: Pattern,
    count: int,
    taken: Sequence[str] = (),
    choice: Callable[[str], str] = secrets.choice,
) -> list[str]:
    """`count` distinct codes, none in `taken`."""
    avoid = set(taken)
    if pattern.space < count + len(avoid):
        raise PatternError(
            f"the pattern makes {pattern.space:,} distinct codes, not {count:,} more"
        )
    codes: dict[str, None] = {}
    while len(codes) < count:
        code = pattern.draw(choice)
        if code not in avoid:
            codes[code] = None
    return list(codes)


# Campaign states whose pool may grow: a draft gains its pool; a started one only tops up the
# pool it started with (workers cache whether a campaign has one once it has left draft).
_TOP_UP = frozenset({"snapshotting", "sending", "paused"})


def pool_refusal(campaign_id: int, status: str, has_pool: bool) -> str | None:
    """Why codes cannot be added to this campaign now, or None."""
    if status == "draft" or (status in _TOP_UP and has_pool):
        return None
    if status in _TOP_UP:
        return (
            f"campaign {campaign_id} is {status} without a promo pool: a pool must exist "
            "before the campaign starts (its recipients are being sent without codes)"
        )
    return f"campaign {campaign_id} is {status}: its pool can no longer change"
