"""Avro schema compatibility, pure: can a reader schema read data written with a writer schema?

Implements the resolution rules of the Avro specification (the ones fastavro and the Java
`SchemaCompatibility` apply), so the offline check in `flashsend schemas check` agrees with
what a consumer will actually do and with the registry's compatibility endpoint:

- primitives match, or are promoted (int → long/float/double, long → float/double,
  float → double, string ↔ bytes); logical types are checked on their underlying type;
- records: names match (unqualified, or through the reader's aliases); every reader field is
  found in the writer (by name or alias) and is compatible, or it has a default; writer
  fields the reader does not know are skipped;
- enums: every writer symbol is known to the reader, unless the reader has a default symbol;
- arrays, maps: items / values compatible; fixed: same name and size;
- a writer union: every branch readable; a reader union: some branch reads the writer.

Levels follow the registry's names: BACKWARD (the new schema reads old data), FORWARD (old
readers read new data), FULL (both), each optionally _TRANSITIVE (against every earlier
version instead of only the latest), NONE.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
PROMOTIONS: Mapping[str, frozenset[str]] = {
    "int": frozenset({"long", "float", "double"}),
    "long": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "string": frozenset({"bytes"}),
    "bytes": frozenset({"string"}),
}
LEVELS = frozenset(
    {
        "NONE",
        "BACKWARD",
        "FORWARD",
        "FULL",
        "BACKWARD_TRANSITIVE",
        "FORWARD_TRANSITIVE",
        "FULL_TRANSITIVE",
    }
)
NAMED = frozenset({"record", "enum", "fixed", "error"})


@dataclass
class _Names:
    """Named types of one schema, by full name, so references can be followed."""

    types: dict[str, dict[str, Any]] = field(default_factory=dict)

    def collect(self, schema: Any, namespace: str = "") -> None:
        if isinstance(schema, list):
            for branch in schema:
                self.collect(branch, namespace)
            return
        if not isinstance(schema, dict):
            return
        kind = schema.get("type")
        if kind in NAMED:
            full = _full_name(schema, namespace)
            self.types[full] = schema
            namespace = full.rpartition(".")[0]
            for f in schema.get("fields", []):
                self.collect(f.get("type"), namespace)
        elif kind == "array":
            self.collect(schema.get("items"), namespace)
        elif kind == "map":
            self.collect(schema.get("values"), namespace)
        elif isinstance(kind, dict | list):
            self.collect(kind, namespace)

    def resolve(self, schema: Any, namespace: str) -> Any:
        """Follow a name reference; unwrap `{"type": "int", "logicalType": …}`."""
        if isinstance(schema, str):
            if schema in PRIMITIVES:
                return schema
            for candidate in (f"{namespace}.{schema}" if namespace else schema, schema):
                if candidate in self.types:
                    return self.types[candidate]
            raise ValueError(f"unknown type name {schema!r}")
        if isinstance(schema, dict) and schema.get("type") in PRIMITIVES:
            return schema["type"]
        if (
            isinstance(schema, dict)
            and isinstance(schema.get("type"), dict | list | str)
            and (schema.get("type") not in NAMED | {"array", "map"})
        ):
            return self.resolve(schema["type"], namespace)
        return schema


def _full_name(schema: Mapping[str, Any], namespace: str) -> str:
    name = str(schema["name"])
    if "." in name:
        return name
    ns = schema.get("namespace", namespace) or ""
    return f"{ns}.{name}" if ns else name


def _short(name: str) -> str:
    return name.rpartition(".")[2]


def _kind(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, list):
        return "union"
    return str(schema.get("type"))


def _names_match(reader: Mapping[str, Any], writer: Mapping[str, Any]) -> bool:
    accepted = {_short(str(reader["name"]))} | {_short(a) for a in reader.get("aliases", [])}
    return _short(str(writer["name"])) in accepted


class _Checker:
    def __init__(self, reader: Any, writer: Any) -> None:
        self.rnames, self.wnames = _Names(), _Names()
        self.rnames.collect(reader)
        self.wnames.collect(writer)
        self.problems: list[str] = []
        self._seen: set[tuple[int, int]] = set()

    def check(self, r: Any, w: Any, path: str, rns: str = "", wns: str = "") -> bool:
        r, w = self.rnames.resolve(r, rns), self.wnames.resolve(w, wns)
        rk, wk = _kind(r), _kind(w)
        if wk == "union":
            ok = True
            for i, branch in enumerate(w):
                if not self._readable(r, branch, f"{path}[union branch {i}]", rns, wns):
                    ok = False
            return ok
        if rk == "union":
            if any(self._quiet(branch, w, rns, wns) for branch in r):
                return True
            return self._fail(path, f"writer type {wk} matches no branch of the reader union")
        if rk in PRIMITIVES or wk in PRIMITIVES:
            if rk == wk or rk in PROMOTIONS.get(wk, frozenset()):
                return True
            return self._fail(path, f"writer type {wk} cannot be read as {rk}")
        if rk != wk and not ({rk, wk} <= {"record", "error"}):
            return self._fail(path, f"writer type {wk} cannot be read as {rk}")
        if rk in NAMED and not _names_match(r, w):
            return self._fail(path, f"writer {wk} {w['name']} cannot be read as {r['name']}")
        key = (id(r), id(w))
        if key in self._seen:  # recursive type: already being checked higher up
            return True
        self._seen.add(key)
        if rk in {"record", "error"}:
            return self._record(r, w, path, rns, wns)
        if rk == "enum":
            return self._enum(r, w, path)
        if rk == "fixed":
            if r.get("size") == w.get("size"):
                return True
            return self._fail(path, f"fixed size {w.get('size')} cannot be read as {r.get('size')}")
        if rk == "array":
            return self.check(r["items"], w["items"], f"{path}[]", rns, wns)
        if rk == "map":
            return self.check(r["values"], w["values"], f"{path}{{}}", rns, wns)
        return self._fail(path, f"unsupported type {rk}")

    def _record(self, r: Any, w: Any, path: str, rns: str, wns: str) -> bool:
        rns = _full_name(r, rns).rpartition(".")[0]
        wns = _full_name(w, wns).rpartition(".")[0]
        writer_fields = {f["name"]: f for f in w.get("fields", [])}
        ok = True
        for rf in r.get("fields", []):
            names = [rf["name"], *rf.get("aliases", [])]
            wf = next((writer_fields[n] for n in names if n in writer_fields), None)
            fpath = f"{path}.{rf['name']}"
            if wf is None:
                if "default" not in rf:
                    ok = self._fail(
                        fpath, "reader field has no default and the writer does not have it"
                    )
                continue
            ok = self.check(rf["type"], wf["type"], fpath, rns, wns) and ok
        return ok

    def _enum(self, r: Any, w: Any, path: str) -> bool:
        missing = [s for s in w.get("symbols", []) if s not in set(r.get("symbols", []))]
        if missing and "default" not in r:
            return self._fail(path, f"enum symbols {missing} unknown to the reader")
        return True

    def _readable(self, r: Any, w_branch: Any, path: str, rns: str, wns: str) -> bool:
        return self.check(r, w_branch, path, rns, wns)

    def _quiet(self, r: Any, w: Any, rns: str, wns: str) -> bool:
        saved, self.problems = self.problems, []
        try:
            return self.check(r, w, "", rns, wns) and not self.problems
        finally:
            self.problems = saved

    def _fail(self, path: str, message: str) -> bool:
        self.problems.append(f"{path or '/'}: {message}")
        return False


def read_problems(reader: Any, writer: Any) -> list[str]:
    """Why data written with `writer` cannot be read with `reader` ([] = it can)."""
    checker = _Checker(reader, writer)
    checker.check(reader, writer, "")
    return checker.problems


def compatibility_problems(new: Any, previous: Sequence[Any], level: str = "BACKWARD") -> list[str]:
    """Problems of `new` against earlier versions (oldest first) under a registry level."""
    level = level.upper()
    if level not in LEVELS:
        raise ValueError(f"unknown compatibility level {level}; one of {sorted(LEVELS)}")
    if level == "NONE" or not previous:
        return []
    against = previous if level.endswith("_TRANSITIVE") else previous[-1:]
    base = level.removesuffix("_TRANSITIVE")
    problems: list[str] = []
    for i, old in enumerate(against):
        label = f"version -{len(against) - i}"
        if base in ("BACKWARD", "FULL"):
            problems += [f"new cannot read {label}: {p}" for p in read_problems(new, old)]
        if base in ("FORWARD", "FULL"):
            problems += [f"{label} cannot read new: {p}" for p in read_problems(old, new)]
    return problems
