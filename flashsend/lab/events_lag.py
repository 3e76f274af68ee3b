"""`events_lag` of `flashsend bench`: how long an SES event takes from the stand-in's POST to
its row in PostgreSQL, while a campaign sends at full speed.

Per event, exactly, on a uniform sample: the webhook stamps each record with `received_at`
(the POST's arrival, i.e. the stand-in's emission, on one machine) and the feedback agent
writes `feedback_seen.seen_at` in the transaction that applies it (`now()`: the
transaction's start, a few ms before its commit). The sample is every `every`-th offset of
mail.events from where the campaign began, so it decodes a few thousand records, not a million.
Events still not applied when the wait ends are counted (`not_applied`) and enter the
percentiles with the time since their POST (a lower bound of their lag), never left out.

Events the stand-in never posted are outside that sample: when the machine cannot sign and
post them as fast as the campaign sends, the stand-in's queue for its emitter overflows and
it drops them (real SES does not). `events_dropped_at_standin` counts them over the run, so a
lag figure taken with fewer events than the campaign made says so.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

import psycopg

from flashsend.lab.bench_figures import percentile
from flashsend.lab.feedback_crossing import read_ses_events
from flashsend.settings import Settings
from infra.ses_standin.events_admin import SesEventsAdmin, lost

EVENTS_LAG_KEYS = (
    "events_lag_sample",
    "events_lag_every",
    "events_not_applied",
    "events_emission_drained",
    "events_dropped_at_standin",
    "events_lag_p50_s",
    "events_lag_p99_s",
    "events_lag_max_s",
)
SAMPLE_EVERY = 97  # not a multiple of the partition count: every partition is sampled
POLL_S = 0.5


def events_lag(
    settings: Settings,
    start: Mapping[int, int],
    campaign_id: int,
    *,
    wait_s: float = 300.0,
    every: int = SAMPLE_EVERY,
    dropped_from: int | None = None,
) -> dict[str, Any]:
    """Lag figures (seconds) for the campaign's events on mail.events after `start`; waits
    up to `wait_s` for the stand-in to post them all and for the agent to apply them.
    `dropped_from`: `standin_dropped` when the campaign began."""
    began = time.monotonic()
    admin = SesEventsAdmin(settings.ses_endpoint_url or "")
    drained = True
    try:
        state = admin.wait_drained(timeout=wait_s)
    except TimeoutError:
        drained = False
        state = admin.subscriptions()
    dropped = None if dropped_from is None else given_up(state) - dropped_from
    records = [
        r
        for r in read_ses_events(settings, settings.topic_mail_events, start=start, every=every)
        if r.get("campaign_id") == campaign_id
    ]
    received = {uuid.UUID(str(r["event_id"])): int(r["received_at"]) / 1000.0 for r in records}
    seen: dict[uuid.UUID, float] = {}
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        while True:
            missing = [e for e in received if e not in seen]
            if missing:
                rows = conn.execute(
                    "SELECT event_id, extract(epoch FROM seen_at)::float8 FROM feedback_seen"
                    " WHERE event_id = ANY(%s)",
                    (missing,),
                ).fetchall()
                seen.update({row[0]: float(row[1]) for row in rows})
            if len(seen) == len(received) or time.monotonic() - began > wait_s:
                break
            time.sleep(POLL_S)
    now = time.time()
    # An event not applied yet has waited since its POST at least: it counts as that much.
    lags = sorted(seen.get(e, now) - at for e, at in received.items())
    return {
        "events_lag_sample": len(received),
        "events_lag_every": every,
        "events_not_applied": len(received) - len(seen),
        "events_emission_drained": drained,
        "events_dropped_at_standin": dropped,
        "events_lag_p50_s": _rounded(percentile(lags, 50)),
        "events_lag_p99_s": _rounded(percentile(lags, 99)),
        "events_lag_max_s": _rounded(lags[-1] if lags else None),
    }


def standin_dropped(settings: Settings) -> int:
    """`given_up` now: the figure to take when a campaign begins."""
    return given_up(SesEventsAdmin(settings.ses_endpoint_url or "").subscriptions())


def given_up(state: Mapping[str, Any]) -> int:
    """Events the stand-in has given up on since it started (a `subscriptions()` state): its
    queue for the emitter or the emitter's own overflowed, a subscription's retry window ran
    out, or a Firehose stream's buffer overflowed or its retry duration ran out."""
    subs = state["subscriptions"]
    retries_out = sum(int(sub.get("delivery", {}).get("dropped", 0)) for sub in subs)
    streams = (state.get("firehose") or {}).values()
    firehose = sum(int(st.get("dropped_records", 0)) + int(st.get("overflow", 0)) for st in streams)
    return sum(lost(state).values()) + retries_out + firehose


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
