"""SendBulkEmail entries written straight to JSON text (pure; no boto3 here).

A worker writes one entry per recipient: ~1,000 a second each. Built as dicts and then
dumped (`json.dumps` of the whole request, inner `json.dumps` of each entry's template data)
they cost ~11 µs a recipient; written here as text, ~7.6 µs (docs/decisions.md). The text is
exactly what `json.dumps` writes for the same entry (default separators, non-ASCII escaped):
tests/unit/test_ses_body.py compares the request bytes with botocore's own serialisation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from json.encoder import encode_basestring_ascii
from types import MappingProxyType
from typing import Any, NamedTuple

MAX_REPLACEMENT_HEADERS = 15

_EMPTY: Mapping[str, Any] = MappingProxyType({})
# json's own C function: a str as a JSON string literal with non-ASCII escaped; TypeError for
# anything else, so a header or tag that is not a str fails loudly instead of being coerced.
_quote: Callable[[str], str] = encode_basestring_ascii


class BulkEntry(NamedTuple):
    """One recipient of a SendBulkEmail call. A NamedTuple, not a frozen dataclass: one is
    built per recipient, and the dataclass's init cost ~1 µs more."""

    to: str
    replacement_data: Mapping[str, Any] = _EMPTY
    headers: Mapping[str, str] = _EMPTY
    tags: Mapping[str, str] = _EMPTY


def json_value(value: Any) -> str:
    """`json.dumps(value)`: by hand for the scalars template data holds, json otherwise."""
    kind = type(value)
    if kind is str:
        return _quote(value)
    if kind is int:
        return int.__repr__(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    return json.dumps(value)  # floats (NaN, Infinity), nested lists and objects, subclasses


def json_object(values: Mapping[str, Any]) -> str:
    """`json.dumps(dict(values))` for a mapping with str keys (others: json's own rules)."""
    if not all(type(key) is str for key in values):
        return json.dumps(dict(values))
    return "{" + ", ".join([_quote(k) + ": " + json_value(v) for k, v in values.items()]) + "}"


def _name_values(pairs: Mapping[str, str]) -> str:
    return ", ".join(
        ['{"Name": ' + _quote(k) + ', "Value": ' + _quote(v) + "}" for k, v in pairs.items()]
    )


def entry_json(entry: BulkEntry) -> str:
    """The SES API's `BulkEmailEntry` for `entry`, as `json.dumps` writes it:
    Destination.ToAddresses, ReplacementEmailContent.ReplacementTemplate (the data as a JSON
    string), then ReplacementHeaders and ReplacementTags when there are any."""
    if len(entry.headers) > MAX_REPLACEMENT_HEADERS:
        raise ValueError(f"at most {MAX_REPLACEMENT_HEADERS} replacement headers per entry")
    text = (
        '{"Destination": {"ToAddresses": ['
        + _quote(entry.to)
        + ']}, "ReplacementEmailContent": {"ReplacementTemplate": {"ReplacementTemplateData": '
        + _quote(json_object(entry.replacement_data))
        + "}}"
    )
    if entry.headers:
        text += ', "ReplacementHeaders": [' + _name_values(entry.headers) + "]"
    if entry.tags:
        text += ', "ReplacementTags": [' + _name_values(entry.tags) + "]"
    return text + "}"


class EncodedEntries(list[Any]):
    """`BulkEmailEntries` already written as JSON (the entries' texts joined by ", ").

    Empty as a list: only sinks.ses's before-parameter-build hook knows to put `text` in the
    body. A client without that hook would send no entries, which SES refuses (400), rather
    than anything else."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    @classmethod
    def of(cls, entries: Sequence[BulkEntry]) -> EncodedEntries:
        return cls(", ".join([entry_json(e) for e in entries]))
