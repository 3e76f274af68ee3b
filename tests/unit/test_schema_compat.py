"""Avro schema-resolution rules of the offline contract check (pure)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from schemas.compat import compatibility_problems, read_problems

BASE: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "flashsend.orders.v1",
    "fields": [
        {"name": "id", "type": "int"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        {
            "name": "items",
            "type": {
                "type": "array",
                "items": {
                    "type": "record",
                    "name": "Item",
                    "fields": [{"name": "sku", "type": "string"}],
                },
            },
        },
        {"name": "again", "type": ["null", "Item"], "default": None},
    ],
}


def changed(**edits: Any) -> dict[str, Any]:
    schema = copy.deepcopy(BASE)
    for name, field in edits.items():
        schema["fields"] = [f for f in schema["fields"] if f["name"] != name]
        if field is not None:
            schema["fields"].append({"name": name, **field})
    return schema


def test_identical_and_promotions_are_compatible() -> None:
    assert read_problems(BASE, BASE) == []
    assert read_problems(changed(id={"type": "long"}), BASE) == []  # int written, long read
    assert read_problems(BASE, changed(id={"type": "long"})) != []  # long cannot become int


def test_added_field_needs_a_default_for_backward() -> None:
    ok = changed(locale={"type": "string", "default": "en"})
    bad = changed(locale={"type": "string"})
    assert compatibility_problems(ok, [BASE], "BACKWARD") == []
    assert compatibility_problems(ok, [BASE], "FULL") == []
    problems = compatibility_problems(bad, [BASE], "BACKWARD")
    assert problems and ".locale" in problems[0]


def test_removed_required_field_is_backward_but_not_forward() -> None:
    removed = changed(id=None)
    assert compatibility_problems(removed, [BASE], "BACKWARD") == []
    problems = compatibility_problems(removed, [BASE], "FULL")
    assert problems and "cannot read new" in problems[0] and ".id" in problems[0]


def test_enum_unions_nested_records_and_transitive() -> None:
    more_symbols = changed(
        kind={"type": {"type": "enum", "name": "Kind", "symbols": ["A", "B", "C"]}}
    )
    assert read_problems(more_symbols, BASE) == []
    assert read_problems(BASE, more_symbols) != []  # old reader, unknown symbol C
    nested = copy.deepcopy(BASE)
    nested["fields"][2]["type"]["items"]["fields"].append({"name": "qty", "type": "int"})
    assert any(".items[].qty" in p for p in read_problems(nested, BASE))
    optional = changed(id={"type": ["null", "int"], "default": None})
    assert read_problems(optional, BASE) == []  # int is read by a union branch
    assert read_problems(BASE, optional) != []  # null cannot be read as int
    v2 = changed(locale={"type": "string", "default": "en"})
    v3 = changed(locale={"type": "string", "default": "en"}, id=None)
    assert compatibility_problems(v3, [BASE, v2], "FORWARD") != []
    assert compatibility_problems(v3, [BASE, v2], "NONE") == []
    with pytest.raises(ValueError):
        compatibility_problems(v3, [BASE], "SIDEWAYS")
