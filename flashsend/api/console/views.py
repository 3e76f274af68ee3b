"""What the console's pages show, pure: numbers with thousands separators, progress, rates
against the auto-pause thresholds, the rate chart's points, which buttons a role sees."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from typing import Any

from flashsend.api.keys import allows

FINAL = frozenset({"done", "cancelled", "failed"})
# The statuses a recipient row can have, in the order the page lists them.
COUNTS = ("pending", "sending", "sent", "failed", "unknown", "skipped", "cancelled", "held")


def number(value: Any) -> str:
    """1234567 → '1,234,567'; None → '–'; a float keeps one decimal."""
    if value is None:
        return "–"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.1f}"
    return f"{int(value):,}"


def percent(part: float, whole: float) -> float:
    return 0.0 if whole <= 0 else 100.0 * part / whole


def done_count(view: Mapping[str, Any]) -> int:
    """Rows that will not be sent again: sent, failed, unknown, skipped, cancelled."""
    return sum(int(view.get(k) or 0) for k in ("sent", "failed", "unknown", "skipped", "cancelled"))


def eta_s(view: Mapping[str, Any], rate: float) -> float | None:
    left = int(view.get("pending") or 0) + int(view.get("sending") or 0)
    return round(left / rate, 1) if rate > 0 and left else None


def duration(seconds: float | None) -> str:
    """'1 h 02 min', '3 min 05 s', '42 s'; None → '–'."""
    if seconds is None:
        return "–"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600} h {s % 3600 // 60:02d} min"
    if s >= 60:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s} s"


@dataclass(frozen=True)
class Threshold:
    """A feedback rate beside the rate that pauses the campaign on its own."""

    name: str
    count: int
    rate: float  # of the base, 0..1
    limit: float  # 0..1

    @property
    def over(self) -> bool:
        return self.rate > self.limit


def feedback_rates(
    feedback: Mapping[str, Any] | None, complaint_limit: float, bounce_limit: float
) -> list[Threshold]:
    """Hard bounces and complaints over max(sent, delivered + bounced): the auto-pause's base."""
    f = feedback or {}
    bounced, complained = int(f.get("bounced") or 0), int(f.get("complained") or 0)
    base = max(int(f.get("sent") or 0), int(f.get("delivered") or 0) + bounced)
    rate = (lambda n: n / base) if base else (lambda n: 0.0)
    return [
        Threshold("hard bounces", bounced, rate(bounced), bounce_limit),
        Threshold("complaints", complained, rate(complained), complaint_limit),
    ]


def chart_points(
    series: Sequence[Mapping[str, float]], width: float = 600.0, height: float = 160.0
) -> tuple[str, float]:
    """An SVG polyline's `points` for [{t_s, per_s}, …] scaled into width × height, and the
    highest rate (the axis's top)."""
    if not series:
        return "", 0.0
    top = max(float(p["per_s"]) for p in series) or 1.0
    last_t = max(float(p["t_s"]) for p in series) or 1.0
    points = " ".join(
        f"{width * float(p['t_s']) / last_t:.1f},{height - height * float(p['per_s']) / top:.1f}"
        for p in series
    )
    return points, top


# Which buttons a campaign in `status` offers, for someone of `role`.
_ACTIONS = {
    "draft": ("start",),
    "sending": ("pause", "cancel"),
    "snapshotting": ("pause", "cancel"),
    "paused": ("resume", "cancel"),
}


def actions(role: str, status: str) -> tuple[str, ...]:
    """Start, Pause, Resume, Cancel as the state allows; none for a viewer."""
    if not allows(role, "operator"):
        return ()
    return _ACTIONS.get(status, ())


def when(value: Any) -> str:
    """A time as `<time>`: UTC in the text and on hover; the page's script shows it in the
    viewer's zone (the title keeps UTC). HTML, escaped here."""
    if value is None or value == "":
        return "–"
    at = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    at = at.astimezone(UTC)
    utc = at.strftime("%Y-%m-%d %H:%M:%S UTC")
    iso = escape(at.isoformat())
    return f'<time datetime="{iso}" title="{utc}">{utc}</time>'
