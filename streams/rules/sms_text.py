"""An SMS campaign's message: the body for one recipient, and its segments (pure).

Segments are what carriers bill and what the provider's spend limit counts: a body in the
GSM 03.38 alphabet fits 160 septets in one segment and 153 per segment once split (the
concatenation header takes the rest); any character outside it makes the whole body UCS-2,
70 UTF-16 units in one segment, 67 per segment once split. An extension character (`{`, `€`…)
takes two septets, and a split never cuts an escape pair or a surrogate pair in half.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

GSM_BASIC = frozenset(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?"
    "¡ABCDEFGHIJKLMNOPQRSTUVWXYZÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà"
)
GSM_EXTENSION = frozenset("^{}\\[~]|€\f")

GSM_SINGLE, GSM_PART = 160, 153
UCS2_SINGLE, UCS2_PART = 70, 67

_PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")


@dataclass(frozen=True, slots=True)
class Segments:
    encoding: str  # "GSM-7" | "UCS-2"
    count: int
    units: int  # septets (GSM-7) or UTF-16 code units (UCS-2)


def _split(widths: list[int], single: int, part: int) -> int:
    total = sum(widths)
    if total <= single:
        return 1 if total else 0
    count, used = 1, 0
    for w in widths:
        if used + w > part:
            count += 1
            used = 0
        used += w
    return count


def count_segments(body: str) -> Segments:
    """The segments `body` is sent as (0 for an empty body)."""
    if all(c in GSM_BASIC or c in GSM_EXTENSION for c in body):
        widths = [2 if c in GSM_EXTENSION else 1 for c in body]
        return Segments("GSM-7", _split(widths, GSM_SINGLE, GSM_PART), sum(widths))
    widths = [2 if ord(c) > 0xFFFF else 1 for c in body]
    return Segments("UCS-2", _split(widths, UCS2_SINGLE, UCS2_PART), sum(widths))


def render_body(template: str, values: dict[str, Any]) -> str:
    """`{{name}}` replaced by the recipient's value; an unknown name becomes empty."""
    return _PLACEHOLDER.sub(lambda m: str(values.get(m.group(1), "") or ""), template)
