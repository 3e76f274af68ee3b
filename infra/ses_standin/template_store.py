"""Stored email templates, persisted as `templates.json` in the state directory.

Template changes are rare (setup, not the send path), so the whole file is rewritten on each
change: write a temporary file, then rename it over the old one (atomic on POSIX).
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass
from pathlib import Path

from infra.ses_standin.errors import AlreadyExists, BadRequest, LimitExceeded, NotFound
from infra.ses_standin.templates import CompiledTemplate, TemplateContent, compile_template

MAX_TEMPLATES = 20_000  # SES's default quota of templates per Region


@dataclass(frozen=True, slots=True)
class StoredTemplate:
    name: str
    content: TemplateContent
    created: float
    compiled: CompiledTemplate


class TemplateStore:
    """Templates by name, compiled once at create/update."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._templates: dict[str, StoredTemplate] = {}
        if path.exists():
            for name, item in json.loads(path.read_text(encoding="utf-8")).items():
                content = TemplateContent.from_wire(item["content"])
                self._templates[name] = StoredTemplate(
                    name, content, float(item["created"]), compile_template(content)
                )

    def get(self, name: str) -> StoredTemplate:
        template = self._templates.get(name)
        if template is None:
            raise NotFound(f"Template {name} does not exist.")
        return template

    def find(self, name: str) -> StoredTemplate | None:
        return self._templates.get(name)

    def create(self, name: str, content: TemplateContent, now: float) -> None:
        if name in self._templates:
            raise AlreadyExists(f"Template {name} already exists.")
        if len(self._templates) >= MAX_TEMPLATES:
            raise LimitExceeded(f"Maximum number of templates ({MAX_TEMPLATES}) reached.")
        self._templates[name] = StoredTemplate(name, content, now, compile_template(content))
        self._save()

    def update(self, name: str, content: TemplateContent) -> None:
        old = self.get(name)
        self._templates[name] = StoredTemplate(
            name, content, old.created, compile_template(content)
        )
        self._save()

    def delete(self, name: str) -> None:
        self.get(name)
        del self._templates[name]
        self._save()

    def page(self, size: int, token: str | None) -> tuple[list[StoredTemplate], str | None]:
        """Templates ordered by name; the token is the (opaque) name to resume from."""
        names = sorted(self._templates)
        start = 0
        if token is not None:
            try:
                after = base64.urlsafe_b64decode(token.encode()).decode()
            except (ValueError, UnicodeDecodeError):
                raise BadRequest("Invalid NextToken.") from None
            start = next((i for i, name in enumerate(names) if name >= after), len(names))
        chosen = names[start : start + size]
        following = names[start + size] if start + size < len(names) else None
        next_token = base64.urlsafe_b64encode(following.encode()).decode() if following else None
        return [self._templates[name] for name in chosen], next_token

    def clear(self) -> None:
        self._templates.clear()
        self._save()

    def _save(self) -> None:
        data = {
            name: {"content": t.content.to_wire(), "created": t.created}
            for name, t in self._templates.items()
        }
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self.path)
