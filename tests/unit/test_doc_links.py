"""Every relative link in README.md and docs/ resolves: the file exists and, for a link to a
heading (`page.md#anchor`), the page has that heading."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _prose(page: Path, inline_code: bool = False) -> list[str]:
    """The page's lines outside code blocks, inline code removed unless asked for."""
    lines, in_code = [], False
    for line in page.read_text().splitlines():
        if FENCE.match(line.strip()):
            in_code = not in_code
            continue
        if not in_code:
            lines.append(line if inline_code else re.sub(r"`[^`]*`", "", line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    kept = "".join(c for c in text.strip().lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in _prose(page, inline_code=True):
        match = re.match(r"#{1,6}\s+(.*)", line)
        if match is None:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def _links(page: Path) -> list[str]:
    out = []
    for line in _prose(page):
        out += [link for link in LINK.findall(line) if "://" not in link]
    return [link for link in out if not link.startswith(("mailto:", "<"))]


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in _pages():
        for link in _links(page):
            target, _, anchor = link.partition("#")
            path = (page.parent / target).resolve() if target else page
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{page.relative_to(ROOT)}: {link} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_slug_is_githubs() -> None:
    assert slug("3. Where things live") == "3-where-things-live"
    assert slug("14. `flashsend aws plan | apply`: the AWS set-up") == (
        "14-flashsend-aws-plan--apply-the-aws-set-up"
    )
    assert slug("Rows in doubt, settled by SES's own events") == (
        "rows-in-doubt-settled-by-sess-own-events"
    )
