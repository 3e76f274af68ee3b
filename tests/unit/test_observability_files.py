"""The shipped Grafana dashboard and Prometheus alert rules are well formed; the metrics they
use are collected here for tests/integration/test_observability.py, which checks that running
processes export each of them."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OBSERVABILITY = ROOT / "infra" / "observability"
ALERTS = OBSERVABILITY / "alerts.yml"
DASHBOARD = OBSERVABILITY / "grafana-dashboard.json"
_METRIC = re.compile(r"\bflashsend_[a-z0-9_]+")


def alert_rules() -> list[dict[str, str]]:
    """alert, expr, for, severity of each rule (the file keeps one `key: value` per line)."""
    rules: list[dict[str, str]] = []
    for line in ALERTS.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("- alert:"):
            rules.append({"alert": stripped.removeprefix("- alert:").strip()})
        elif rules and ":" in stripped and not stripped.startswith("#"):
            key, _, value = stripped.partition(":")
            rules[-1].setdefault(key.strip(), value.strip())
    return rules


def dashboard_exprs() -> dict[str, str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {p["title"]: t["expr"] for p in panels for t in p["targets"]}


def used_metrics() -> dict[str, set[str]]:
    """Sample name -> where it is used (alert name or panel title)."""
    used: dict[str, set[str]] = {}
    sources = {r["alert"]: r["expr"] for r in alert_rules()} | dashboard_exprs()
    for where, expr in sources.items():
        for name in _METRIC.findall(expr):
            used.setdefault(name, set()).add(where)
    return used


def test_every_rule_has_an_expression_a_severity_and_a_command() -> None:
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)) >= 10
    for rule in rules:
        assert rule.get("expr") and _METRIC.search(rule["expr"]), rule
        assert rule.get("severity") in {"warning", "page"}, rule
        assert rule.get("command"), rule


def test_the_alerts_cover_what_operations_watch() -> None:
    used = used_metrics()
    alerts = {r["alert"] for r in alert_rules()}
    for metric in (
        "flashsend_complaint_rate",
        "flashsend_consumer_lag",
        "flashsend_dlq_messages",
        "flashsend_campaign_recipients",
        "flashsend_outbox_oldest_age_seconds",
    ):
        assert used.get(metric, set()) & alerts, metric


def test_dashboard_panels_each_query_flashsend_metrics() -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 15
    assert all(_METRIC.search(e) for e in exprs.values())
    for name in used_metrics():  # sample names as exported: counters end in _total
        base = name.removesuffix("_bucket")
        assert not base.endswith(("_count", "_sum")) or base.startswith("flashsend_ses_call")
