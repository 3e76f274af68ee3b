"""SESv2 request shapes: parse and validate JSON bodies into frozen requests (pure).

Limits follow the botocore model and the SES developer guide: ≤ 50 entries per
SendBulkEmail, ≤ 50 recipients per message (`recipients.py`), ≤ 15 headers per header list
(name `[!-9;-@A-~]{1,126}`, value `[ -~]{1,995}`), template data ≤ 262,144 characters, and
message tag names/values `[A-Za-z0-9_-]{1,256}` (the model's documented alphabet). Any
violation is a 400 BadRequestException for the whole call; nothing of it is sent.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import Message
from email.parser import BytesHeaderParser
from typing import Any

from infra.ses_standin.errors import BadRequest
from infra.ses_standin.recipients import (
    Recipients,
    parse_address,
    parse_destination,
    parse_raw_recipients,
)
from infra.ses_standin.templates import TemplateContent, parse_template_data

Json = dict[str, Any]

MAX_BULK_ENTRIES = 50
MAX_HEADERS = 15
MAX_TEMPLATE_DATA = 262_144
MAX_PAGE_SIZE = 100
DEFAULT_PAGE_SIZE = 10

_TAG_RE = re.compile(r"[A-Za-z0-9_-]{1,256}")
_HEADER_NAME_RE = re.compile(r"[!-9;-@A-~]{1,126}")
_HEADER_VALUE_RE = re.compile(r"[ -~]{1,995}")
_TEMPLATE_NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Error labels of bulk entry i (entry, Destination, tags, headers, data), made once, not per entry.
_ENTRY_LABELS = [
    (
        f"BulkEmailEntries[{i}]",
        f"BulkEmailEntries[{i}].Destination",
        f"BulkEmailEntries[{i}].ReplacementTags",
        f"BulkEmailEntries[{i}].ReplacementHeaders",
        f"BulkEmailEntries[{i}].ReplacementTemplateData",
    )
    for i in range(MAX_BULK_ENTRIES)
]


@dataclass(frozen=True, slots=True)
class TemplateRef:
    """`Template` content: a stored template by name/ARN, or inline content."""

    name: str | None
    inline: TemplateContent | None
    data: Json
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class BulkEntry:
    """One `BulkEmailEntry` with defaults already merged (tags, headers, template data)."""

    recipients: Recipients
    tags: dict[str, str]
    headers: dict[str, str]
    data: Json


@dataclass(frozen=True, slots=True)
class BulkRequest:
    """A validated SendBulkEmail call."""

    sender: str
    configuration_set: str | None
    template: TemplateRef
    entries: tuple[BulkEntry, ...]

    @property
    def recipient_count(self) -> int:
        return sum(entry.recipients.count for entry in self.entries)


@dataclass(frozen=True, slots=True)
class SimpleContent:
    subject: str
    text: str | None
    html: str | None


@dataclass(frozen=True, slots=True)
class RawContent:
    data: bytes
    subject: str | None


@dataclass(frozen=True, slots=True)
class EmailRequest:
    """A validated SendEmail call (Simple, Raw or Template content)."""

    sender: str
    recipients: Recipients
    configuration_set: str | None
    tags: dict[str, str]
    headers: dict[str, str]
    content: SimpleContent | RawContent | TemplateRef


def parse_bulk_request(body: Json) -> BulkRequest:
    """Validate a SendBulkEmail body; raise BadRequest on any violation."""
    sender = _sender(body)
    default_tags = parse_tags(body.get("DefaultEmailTags"), "DefaultEmailTags")
    content = _req_obj(body, "DefaultContent")
    template_obj = _req_obj(content, "Template", where="DefaultContent")
    template = parse_template_ref(template_obj, "DefaultContent.Template")
    raw_entries = body.get("BulkEmailEntries")
    if not isinstance(raw_entries, list) or not raw_entries:
        raise BadRequest("BulkEmailEntries must contain at least one entry.")
    if len(raw_entries) > MAX_BULK_ENTRIES:
        raise BadRequest(
            f"BulkEmailEntries contains {len(raw_entries)} entries; "
            f"the maximum is {MAX_BULK_ENTRIES}."
        )
    entries = tuple(
        _bulk_entry(raw, i, default_tags, template) for i, raw in enumerate(raw_entries)
    )
    return BulkRequest(
        sender=sender,
        configuration_set=_str(body, "ConfigurationSetName"),
        template=template,
        entries=entries,
    )


def parse_email_request(body: Json) -> EmailRequest:
    """Validate a SendEmail body; raise BadRequest on any violation."""
    content = _req_obj(body, "Content")
    kinds = [key for key in ("Simple", "Raw", "Template") if content.get(key) is not None]
    if len(kinds) != 1:
        raise BadRequest("Content must contain exactly one of Simple, Raw or Template.")
    kind = kinds[0]
    payload: SimpleContent | RawContent | TemplateRef
    headers: dict[str, str] = {}
    raw_headers = Message()
    if kind == "Simple":
        simple = _req_obj(content, "Simple")
        payload = _simple_content(simple)
        headers = parse_headers(simple.get("Headers"), "Content.Simple.Headers")
    elif kind == "Raw":
        payload, raw_headers = _raw_content(_req_obj(content, "Raw"))
    else:
        payload = parse_template_ref(_req_obj(content, "Template"), "Content.Template")
        headers = payload.headers
    destination = body.get("Destination")
    if destination is None and kind == "Raw":
        recipients = parse_raw_recipients(raw_headers)
    else:
        if not isinstance(destination, dict):
            raise BadRequest("Destination is required.")
        recipients = parse_destination(destination, "Destination")
    if body.get("FromEmailAddress") is None and kind == "Raw" and raw_headers.get("From"):
        sender = parse_address(str(raw_headers["From"]), "From header")[0]
    else:
        sender = _sender(body)
    return EmailRequest(
        sender=sender,
        recipients=recipients,
        configuration_set=_str(body, "ConfigurationSetName"),
        tags=parse_tags(body.get("EmailTags"), "EmailTags"),
        headers=headers,
        content=payload,
    )


def parse_template_ref(obj: Json, where: str) -> TemplateRef:
    """A `Template` object: TemplateName, TemplateArn or inline TemplateContent, plus data."""
    name = _str(obj, "TemplateName", where=where)
    arn = _str(obj, "TemplateArn", where=where)
    if name is None and arn is not None:
        # arn:aws:ses:<region>:<account>:template/<name>
        name = arn.rsplit("template/", 1)[-1] if "template/" in arn else None
        if not name:
            raise BadRequest(f"{where}.TemplateArn is not a template ARN: {arn}")
    inline_obj = _obj(obj, "TemplateContent", where=where)
    inline = _template_content(inline_obj, where) if inline_obj is not None else None
    if name is None and inline is None:
        raise BadRequest(f"{where} must specify TemplateName, TemplateArn or TemplateContent.")
    return TemplateRef(
        name=name,
        inline=inline,
        data=_template_data(obj.get("TemplateData"), f"{where}.TemplateData"),
        headers=parse_headers(obj.get("Headers"), f"{where}.Headers"),
    )


def parse_template_request(body: Json, path_name: str | None = None) -> tuple[str, TemplateContent]:
    """CreateEmailTemplate (name in body) / UpdateEmailTemplate (name in path) bodies."""
    name = path_name if path_name is not None else _str(body, "TemplateName", required=True)
    assert name is not None
    check_template_name(name)
    content = _req_obj(body, "TemplateContent")
    return name, _template_content(content, "TemplateContent")


def check_template_name(name: str) -> None:
    """Template names: up to 64 ASCII letters, digits, underscores or dashes."""
    if _TEMPLATE_NAME_RE.fullmatch(name) is None:
        raise BadRequest(
            f"Invalid template name {name!r}: up to 64 letters, digits, '_' or '-' allowed."
        )


def parse_page(query: Mapping[str, str]) -> tuple[int, str | None]:
    """ListEmailTemplates `PageSize` (1..100, default 10) and `NextToken` query parameters."""
    raw_size = query.get("PageSize")
    size = DEFAULT_PAGE_SIZE
    if raw_size is not None:
        try:
            size = int(raw_size)
        except ValueError:
            raise BadRequest(f"PageSize must be an integer: {raw_size}") from None
        if not 1 <= size <= MAX_PAGE_SIZE:
            raise BadRequest(f"PageSize must be between 1 and {MAX_PAGE_SIZE}.")
    return size, query.get("NextToken") or None


def parse_tags(raw: Any, where: str) -> dict[str, str]:
    """A `MessageTagList` as a dict; names and values must match `[A-Za-z0-9_-]{1,256}`."""
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise BadRequest(f"{where} must be a list.")
    tags: dict[str, str] = {}
    for tag in raw:
        if not isinstance(tag, dict):
            raise BadRequest(f"{where} members must be objects.")
        name, value = tag.get("Name"), tag.get("Value")
        if not isinstance(name, str) or _TAG_RE.fullmatch(name) is None:
            raise BadRequest(f"Invalid message tag name {name!r} in {where}.")
        if not isinstance(value, str) or _TAG_RE.fullmatch(value) is None:
            raise BadRequest(f"Invalid message tag value {value!r} for tag {name} in {where}.")
        tags[name] = value
    return tags


def parse_headers(raw: Any, where: str) -> dict[str, str]:
    """A `MessageHeaderList` (≤ 15) as a dict name → value."""
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise BadRequest(f"{where} must be a list.")
    if len(raw) > MAX_HEADERS:
        raise BadRequest(f"{where} contains {len(raw)} headers; the maximum is {MAX_HEADERS}.")
    headers: dict[str, str] = {}
    for header in raw:
        if not isinstance(header, dict):
            raise BadRequest(f"{where} members must be objects.")
        name, value = header.get("Name"), header.get("Value")
        if not isinstance(name, str) or _HEADER_NAME_RE.fullmatch(name) is None:
            raise BadRequest(f"Invalid header name {name!r} in {where}.")
        if not isinstance(value, str) or _HEADER_VALUE_RE.fullmatch(value) is None:
            raise BadRequest(f"Invalid value for header {name} in {where}.")
        headers[name] = value
    return headers


def merge_headers(defaults: dict[str, str], overrides: dict[str, str]) -> dict[str, str]:
    """Entry headers replace template headers of the same (case-insensitive) name."""
    if not defaults:
        return overrides
    if not overrides:
        return defaults
    replaced = {name.lower() for name in overrides}
    merged = {name: value for name, value in defaults.items() if name.lower() not in replaced}
    merged.update(overrides)
    return merged


def _bulk_entry(
    raw: Any, index: int, default_tags: dict[str, str], template: TemplateRef
) -> BulkEntry:
    where, at_destination, at_tags, at_headers, at_data = _ENTRY_LABELS[index]
    if not isinstance(raw, dict):
        raise BadRequest(f"{where} must be an object.")
    destination = raw.get("Destination")
    if not isinstance(destination, dict):
        raise BadRequest(f"{at_destination} is required.")
    recipients = parse_destination(destination, at_destination)
    tags = parse_tags(raw.get("ReplacementTags"), at_tags)
    headers = parse_headers(raw.get("ReplacementHeaders"), at_headers)
    data = template.data
    replacement = raw.get("ReplacementEmailContent")
    if replacement is not None:
        if not isinstance(replacement, dict):
            raise BadRequest(f"{where}.ReplacementEmailContent must be an object.")
        repl_template = _obj(replacement, "ReplacementTemplate", where=where)
        if repl_template is not None:
            entry_data = _template_data(repl_template.get("ReplacementTemplateData"), at_data)
            if entry_data:
                data = {**data, **entry_data} if data else entry_data
    return BulkEntry(  # positional: 50 per call, and keywords cost ~0.2 µs more each time
        recipients,
        {**default_tags, **tags} if default_tags else tags,
        merge_headers(template.headers, headers),
        data,
    )


def _sender(body: Json) -> str:
    raw = body.get("FromEmailAddress")
    if raw is None:
        raise BadRequest("FromEmailAddress is required.")
    return parse_address(raw, "FromEmailAddress")[0]


def _template_data(raw: Any, where: str) -> Json:
    if raw is not None and not isinstance(raw, str):
        raise BadRequest(f"{where} must be a JSON string.")
    if raw is not None and len(raw) > MAX_TEMPLATE_DATA:
        raise BadRequest(f"{where} is longer than {MAX_TEMPLATE_DATA} characters.")
    try:
        return parse_template_data(raw, where)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


def _template_content(obj: Json, where: str) -> TemplateContent:
    try:
        return TemplateContent.from_wire(obj)
    except ValueError as exc:
        raise BadRequest(f"{where}: {exc}") from None


def _simple_content(obj: Json) -> SimpleContent:
    subject = _req_obj(obj, "Subject", where="Content.Simple")
    body = _req_obj(obj, "Body", where="Content.Simple")
    text = _obj(body, "Text", where="Content.Simple.Body")
    html = _obj(body, "Html", where="Content.Simple.Body")
    return SimpleContent(
        subject=_str(subject, "Data", required=True, where="Content.Simple.Subject") or "",
        text=_str(text, "Data", required=True, where="Body.Text") if text else None,
        html=_str(html, "Data", required=True, where="Body.Html") if html else None,
    )


def _raw_content(obj: Json) -> tuple[RawContent, Message]:
    encoded = _str(obj, "Data", required=True, where="Content.Raw") or ""
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise BadRequest("Content.Raw.Data is not valid base64.") from None
    headers = BytesHeaderParser().parsebytes(data)
    subject = headers.get("Subject")
    return RawContent(data=data, subject=str(subject) if subject else None), headers


def _obj(obj: Json, key: str, *, where: str = "") -> Json | None:
    value = obj.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadRequest(f"{_label(where, key)} must be an object.")
    return value


def _req_obj(obj: Json, key: str, *, where: str = "") -> Json:
    value = _obj(obj, key, where=where)
    if value is None:
        raise BadRequest(f"{_label(where, key)} is required.")
    return value


def _label(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _str(obj: Json, key: str, *, required: bool = False, where: str = "") -> str | None:
    value = obj.get(key)
    label = _label(where, key)
    if value is None:
        if required:
            raise BadRequest(f"{label} is required.")
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{label} must be a string.")
    return value
