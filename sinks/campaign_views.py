"""What `campaign status --json` and `campaign report --json` show, as dictionaries: one
function each, used by the command line and the HTTP API alike."""

from __future__ import annotations

import time
from typing import Any

import psycopg

from sinks.campaign_store import CampaignStore
from sinks.promo_store import PromoStore
from sinks.queries import query
from sinks.ramp_store import ramp_status
from sinks.resolution_store import UnknownRowsStore
from sinks.schedule_store import ScheduleStore, schedule_summary
from sinks.seed_store import SeedStore, hold_summary
from sinks.variant_store import VariantStore, variants_summary
from streams.rules.feedback_lag import REPORT_FRESH_S
from streams.rules.resolution import in_doubt_summary


def status_view(conn: psycopg.Connection[Any], campaign_id: int) -> dict[str, Any]:
    """Counts per status, rate, promo codes, feedback lag, A/B test, schedule and ramp
    (NotFound for an unknown id). `query_ms` times the counters' read."""
    store = CampaignStore(conn)
    began = time.perf_counter()
    progress = store.progress(campaign_id)
    promo = PromoStore(conn).counts(campaign_id)
    query_ms = (time.perf_counter() - began) * 1000
    ab = variants_summary(VariantStore(conn), campaign_id)
    schedule = schedule_summary(ScheduleStore(conn), campaign_id)
    ramp = ramp_status(conn, campaign_id)
    feedback_lag = store.feedback_lag(REPORT_FRESH_S)
    out: dict[str, Any] = {
        **progress.as_dict(),
        **(promo.as_dict() if promo else {}),
        "feedback_lag_s": None if feedback_lag is None else round(feedback_lag, 1),
        "query_ms": round(query_ms, 1),
    }
    if ab is not None:
        out["ab_test"] = ab
    if schedule is not None:
        out["schedule"] = schedule
    if ramp is not None:
        out["ramp"] = ramp
    return out


def report_view(
    conn: psycopg.Connection[Any], campaign_id: int, bucket_s: float = 10.0
) -> dict[str, Any]:
    """Final counts per status and reason, in-doubt rows, rate over time."""
    progress = CampaignStore(conn).progress(campaign_id).as_dict()
    reasons = conn.execute(query("report_reasons"), {"id": campaign_id}).fetchall()
    rate = conn.execute(query("report_rate"), {"id": campaign_id, "bucket_s": bucket_s}).fetchall()
    promo = PromoStore(conn).counts(campaign_id)
    ab = variants_summary(VariantStore(conn), campaign_id)
    schedule = schedule_summary(ScheduleStore(conn), campaign_id)
    seeds = hold_summary(SeedStore(conn), campaign_id)
    return {
        "campaign": progress,
        "promo_codes": None if promo is None else promo.as_dict(),
        **({"ab_test": ab} if ab is not None else {}),
        **({"schedule": schedule} if schedule is not None else {}),
        **({"seed_list": seeds} if seeds is not None else {}),
        "by_status_reason": [{"status": s, "reason": r or None, "count": n} for s, r, n in reasons],
        "in_doubt": in_doubt_summary(reasons, UnknownRowsStore(conn).resends(campaign_id)),
        "rate_over_time": [{"t_s": b * bucket_s, "per_s": round(n / bucket_s, 1)} for b, n in rate],
    }
