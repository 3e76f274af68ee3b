"""Email templates: wire content, compilation and `{{var}}` rendering (pure).

SES renders templates with Handlebars. The stand-in supports what flashsend uses:
`{{name}}`, `{{ name }}`, dotted paths (`{{user.first}}`) and triple braces (`{{{name}}}`,
never HTML-escaped). Block helper tags (`{{#if x}}`, `{{/if}}`, `{{else}}`, `{{!comment}}`) are
dropped while the text between them is kept (no conditionals or loops), and they are not
checked for data. A variable that the template references but the data
does not contain is a *rendering failure*: like SES, the send call still succeeds and the
failure is reported later (we record it on the message for the event emitter).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# One `{{…}}` or `{{{…}}}` tag. Group 1 is the triple-brace body, group 2 the double-brace one.
_TAG_RE = re.compile(r"\{\{\{\s*([^{}]*?)\s*\}\}\}|\{\{\s*([^{}]*?)\s*\}\}")
_IGNORED_PREFIXES = ("#", "/", "^", "!", ">")
_scan_once: Any = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # as json.loads


@dataclass(frozen=True, slots=True)
class Var:
    """A variable reference inside a template field."""

    path: tuple[str, ...]
    escape: bool


@dataclass(frozen=True, slots=True)
class TemplateContent:
    """The three parts of an SES template, as sent on the wire (`EmailTemplateContent`)."""

    subject: str | None = None
    text: str | None = None
    html: str | None = None

    @classmethod
    def from_wire(cls, obj: Mapping[str, Any]) -> TemplateContent:
        """Build from the `EmailTemplateContent` JSON object; raise ValueError on bad types."""
        values: dict[str, str | None] = {}
        for key in ("Subject", "Text", "Html"):
            value = obj.get(key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"TemplateContent.{key} must be a string")
            values[key] = value
        return cls(subject=values["Subject"], text=values["Text"], html=values["Html"])

    def to_wire(self) -> dict[str, str]:
        """The `EmailTemplateContent` JSON object (absent parts omitted, as SES does)."""
        out: dict[str, str] = {}
        if self.subject is not None:
            out["Subject"] = self.subject
        if self.text is not None:
            out["Text"] = self.text
        if self.html is not None:
            out["Html"] = self.html
        return out


@dataclass(frozen=True, slots=True)
class CompiledTemplate:
    """A template parsed once, rendered many times (once per bulk entry)."""

    subject: tuple[str | Var, ...]
    text: tuple[str | Var, ...]
    html: tuple[str | Var, ...]
    variables: tuple[tuple[str, ...], ...]

    def missing_variable(self, data: Mapping[str, Any]) -> str | None:
        """Name of the first referenced variable absent from `data`, or None."""
        for path in self.variables:
            if _lookup(data, path) is _MISSING:
                return ".".join(path)
        return None

    def render_subject(self, data: Mapping[str, Any]) -> str:
        """Render the subject line (missing variables render as empty)."""
        return render_parts(self.subject, data)


def compile_field(source: str | None) -> tuple[str | Var, ...]:
    """Split one template field into literals and variable references."""
    if not source:
        return ()
    parts: list[str | Var] = []
    pos = 0
    for match in _TAG_RE.finditer(source):
        if match.start() > pos:
            parts.append(source[pos : match.start()])
        pos = match.end()
        triple, double = match.group(1), match.group(2)
        body = triple if triple is not None else double
        if not body or body.startswith(_IGNORED_PREFIXES) or body == "else":
            continue
        path = tuple(segment for segment in body.split(".") if segment)
        if path and path[0] == "this":
            path = path[1:]
        if path:
            parts.append(Var(path=path, escape=triple is None))
    if pos < len(source):
        parts.append(source[pos:])
    return tuple(parts)


def compile_template(content: TemplateContent) -> CompiledTemplate:
    """Compile all three fields and collect the distinct variables they reference."""
    subject = compile_field(content.subject)
    text = compile_field(content.text)
    body_html = compile_field(content.html)
    seen: dict[tuple[str, ...], None] = {}
    for part in (*subject, *text, *body_html):
        if isinstance(part, Var):
            seen.setdefault(part.path, None)
    return CompiledTemplate(subject, text, body_html, tuple(seen))


def render_parts(
    parts: tuple[str | Var, ...], data: Mapping[str, Any], *, html_escape: bool = False
) -> str:
    """Render a compiled field; `html_escape` applies Handlebars escaping to `{{var}}`."""
    out: list[str] = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
            continue
        value = _lookup(data, part.path)
        text = "" if value is _MISSING else _stringify(value)
        out.append(html.escape(text) if html_escape and part.escape else text)
    return "".join(out)


def parse_template_data(raw: str | None, where: str) -> dict[str, Any]:
    """Parse an `EmailTemplateData` JSON string into an object; raise ValueError if invalid."""
    if raw is None or raw == "":
        return {}
    if raw[0] == "{":
        # What `json.loads` does, minus its Python layers (one call per bulk entry): scan one
        # value from index 0; if that is the whole string, it is the object `json.loads`
        # returns. Anything else (whitespace, trailing data, errors) takes the general path.
        try:
            value, end = _scan_once(raw, 0)
        except (StopIteration, ValueError):
            pass
        else:
            if end == len(raw):
                return value  # type: ignore[no-any-return]
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be a JSON object")
    return value


class _Missing:
    """Sentinel for an absent variable (distinct from a JSON null)."""


_MISSING: Any = _Missing()


def _lookup(data: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = data
    for segment in path:
        # `type(…) is dict` first: the isinstance check against the Mapping ABC is slow, and
        # template data is parsed JSON, i.e. plain dicts.
        if type(value) is dict:
            value = value.get(segment, _MISSING)
            if value is _MISSING:
                return _MISSING
        elif isinstance(value, Mapping) and segment in value:
            value = value[segment]
        else:
            return _MISSING
    return value


def _stringify(value: Any) -> str:
    # Mirror JavaScript's String(): true/false, no ".0" on whole floats, null → "".
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"))
