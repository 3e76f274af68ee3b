"""`pause_latency_ms` of `flashsend bench`: how long mail still reaches SES after a pause.

One campaign per rate (0 = full speed, and a limit). Each cycle: wait until the stand-in is
accepting the campaign's mail, call the function behind `flashsend campaign pause`
(control_campaign, which returns once every worker has had time to see the pause), then wait
until the stand-in has accepted nothing more for the campaign for SETTLED_S and take its last
acceptance time; then resume. Latency = last acceptance - the moment pause returned (also
given from the moment pause was called). Both times are wall clocks of this host; the
stand-in's clock is checked against ours first (`clock_problem`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from flashsend.errors import UsageError
from flashsend.lab.bench_campaign import audience_of
from flashsend.lab.bench_figures import clock_check, pause_latency, summary
from flashsend.lab.run import StartedCampaigns
from flashsend.settings import Settings
from infra.ses_standin.admin import SesStandinAdmin
from producers.campaign import start_campaign
from producers.campaign_ops import control_campaign, create_campaign

SETTLED_S = 1.0  # no acceptance for this long after a pause: the pause has taken effect
SETTLE_MAX_S = 10.0  # give up waiting for that (the latency is then at least this)
SENDING_FOR_S = 0.5  # how long the campaign sends before each pause
POLL_S = 0.02


def check_clock(ses: SesStandinAdmin) -> dict[str, Any]:
    """The stand-in's clock against ours, best of 5 reads (the tightest bracket)."""
    checks = []
    for _ in range(5):
        before = time.time()
        now = ses.stats(campaign="bench-clock-check")["now"]  # no such campaign: cheap
        checks.append(clock_check(before, now, time.time()))
    best = min(checks, key=lambda c: c.uncertainty_ms)
    return {
        "clock_offset_ms": best.offset_ms,
        "clock_uncertainty_ms": best.uncertainty_ms,
        "clock_problem": best.problem,
    }


def _accepted(ses: SesStandinAdmin, cid: int) -> tuple[int, float | None]:
    stats = ses.stats(campaign=str(cid))
    return stats["accepted"], stats["last_ts"]


def _wait_sending(ses: SesStandinAdmin, cid: int, timeout: float) -> bool:
    """Until the stand-in accepts the campaign's mail again, then SENDING_FOR_S more; False if
    it does not within `timeout` (the campaign has no mail left, or the workers stalled)."""
    base, _ = _accepted(ses, cid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _accepted(ses, cid)[0] > base:
            time.sleep(SENDING_FOR_S)
            return True
        time.sleep(POLL_S)
    return False


def _settle(ses: SesStandinAdmin, cid: int) -> tuple[float | None, bool]:
    """The campaign's last acceptance once nothing new came for SETTLED_S; and whether it
    settled within SETTLE_MAX_S."""
    count, last = _accepted(ses, cid)
    quiet_since = time.monotonic()
    give_up = quiet_since + SETTLE_MAX_S
    while time.monotonic() < give_up:
        time.sleep(POLL_S)
        now_count, now_last = _accepted(ses, cid)
        if now_count != count:
            count, last, quiet_since = now_count, now_last, time.monotonic()
        elif time.monotonic() - quiet_since >= SETTLED_S:
            return last, True
    return last, False


def pause_run(
    settings: Settings,
    started: StartedCampaigns,
    rate: float,
    pauses: int,
    recipients: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """`pauses` pause/resume cycles on one campaign at `rate`; it is cancelled afterwards."""
    ses = SesStandinAdmin(settings.ses_endpoint_url or "")
    cid = started.add(
        create_campaign(
            settings,
            name=f"bench-pause-{rate:g}-{int(time.time())}",
            rate=rate,
            audience=audience_of(settings, recipients),
        )
    )
    log(f"bench: {pauses} pauses at rate {rate:g}/s ({recipients:,} recipients)")
    start_campaign(settings, cid)
    from_return: list[float] = []
    from_request: list[float] = []
    unsettled = 0
    for _ in range(pauses):
        if not _wait_sending(ses, cid, timeout=30.0):
            log(f"bench: campaign {cid} stopped sending; {len(from_return)} pauses measured")
            break
        requested = time.time()
        control_campaign(settings, cid, "pause", "bench")
        returned = time.time()
        last, settled = _settle(ses, cid)
        unsettled += not settled
        latency = pause_latency(requested, returned, last)
        if latency["from_return_ms"] is not None and latency["from_request_ms"] is not None:
            from_return.append(latency["from_return_ms"])
            from_request.append(latency["from_request_ms"])
        control_campaign(settings, cid, "resume", None)
    with contextlib.suppress(UsageError):  # finished meanwhile
        control_campaign(settings, cid, "cancel", "bench done")
    return {
        "rate": rate,
        "campaign_id": cid,
        **summary(from_return),
        "from_request_ms": summary(from_request),
        "not_settled": unsettled,
    }


def pause_figures(runs: list[dict[str, Any]], clock: dict[str, Any]) -> dict[str, Any]:
    """`pause_latency_ms`: every pause of every rate together, then each rate's own."""
    every = [v for run in runs for v in run["all"]]
    return {**summary(every), "at_rate": runs, **clock}
