"""`limiter_sweep` of `flashsend bench`: one short campaign per limit, judged at the SES
stand-in (the provider's own record, not our rows).

For each rate R the campaign has R x `seconds` recipients, so every run sends for about
`seconds` whatever R. Per run:
- `max_1s_window`: the most recipients the stand-in accepted in any sliding 1-s window;
  `ratio` = max_1s_window / R (SES enforces MaxSendRate per second: > 1 is over the limit);
- `avg_ratio`: the steady-state accepted rate / R, the steady state being the run from its
  first accepted entry + 1 s to its last accepted entry - 1 s (bench_figures.steady_state).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from flashsend.lab.bench_campaign import audience_of, run_campaign
from flashsend.lab.bench_figures import limiter_figures
from flashsend.lab.run import StartedCampaigns
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from infra.ses_standin.admin import SesStandinAdmin

# Acceptance times at the stand-in are per call; 1 ms buckets keep them exact enough for the
# steady-state window. The stand-in answers at most 100,000 buckets: a long run gets coarser
# ones, at most half that many.
SERIES_BUCKET_MS = 1
MAX_SERIES_BUCKETS = 50_000


def series_bucket_ms(span_s: float) -> int:
    """The bucket for a run whose acceptances span at most `span_s` seconds."""
    return max(SERIES_BUCKET_MS, math.ceil(span_s * 1000 / MAX_SERIES_BUCKETS))


def run_sweep(
    settings: Settings,
    pool: WorkerPool,
    started: StartedCampaigns,
    rates: Sequence[float],
    seconds: float,
    log: Callable[[str], None],
) -> tuple[list[dict[str, Any]], dict[float, list[tuple[float, int]]]]:
    """The sweep's rows, and each run's per-second series (for the plot)."""
    ses = SesStandinAdmin(settings.ses_endpoint_url or "")
    rows: list[dict[str, Any]] = []
    series_by_rate: dict[float, list[tuple[float, int]]] = {}
    for rate in rates:
        recipients = max(1, round(rate * seconds))
        log(f"bench: limiter at {rate:g}/s, {recipients:,} recipients")
        run = run_campaign(
            settings,
            pool,
            started,
            rate,
            audience=audience_of(settings, recipients),
            timeout=max(120.0, 10 * seconds),
        )
        span_s = run["end_to_end_s"] or 2 * seconds
        series = ses.rate(str(run["campaign_id"]), series_bucket_ms(span_s))
        rows.append(
            {
                **limiter_figures(rate, run["max_1s_window"], series),
                "recipients": run["recipients"],
                "sent": run["sent"],
                "send_rate_per_s": run["send_rate_per_s"],
                "duplicates": run["duplicates"],
                "campaign_id": run["campaign_id"],
            }
        )
        series_by_rate[rate] = ses.rate(str(run["campaign_id"]), 1000)
    return rows, series_by_rate
