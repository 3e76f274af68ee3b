"""The feedback loop end to end on the real stack (`flashsend feedback e2e`, and its test).

1. `users` opted-in users; the SES stand-in is told to make `p_bounce` of the addresses hard
   bounce and `p_complaint` complain (scoped to this run's configuration set).
2. A real webhook process is subscribed to the stand-in's event topic (signed SNS round trip,
   confirmation included), a feedback worker and campaign workers are started.
3. Campaign 1 runs until it pauses itself (complaint rate > threshold after `min_sample`).
4. Once every event is through (stand-in drained, feedback group caught up): the suppression
   table must hold exactly the addresses the stand-in bounced or complained for campaign 1.
5. Campaign 2 targets everyone campaign 1 mailed: none of the suppressed addresses may reach
   SES, every other one must.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from flashsend import deliverability
from flashsend.lab.feedback_crossing import find_crossing, read_ses_events
from flashsend.lab.feedback_run import (
    WebhookProcess,
    campaign_row,
    feedback_counters,
    feedback_lag,
    in_scratch,
    insert_users,
    suppressed,
    wait_for,
    with_feedback,
)
from flashsend.lab.run import StartedCampaigns, finish_run
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from infra.ses_standin.events_admin import SesEventsAdmin
from producers.campaign import start_campaign
from producers.campaign_ops import control_campaign, create_campaign
from sinks.ses import SesSender, make_client

TEMPLATE = ("feedback_e2e", "{{first_name}}, flash sale", "<p>Hi {{first_name}}</p>", "Hi")
EVENT_TYPES = ("Delivery", "Bounce", "Complaint")


@dataclass(frozen=True)
class E2eOptions:
    users: int = 50_000
    rate: float = 300.0
    p_complaint: float = 0.003
    p_bounce: float = 0.02
    min_sample: int = 10_000
    workers: int = 2
    timeout_s: float = 900.0
    event_types: tuple[str, ...] = EVENT_TYPES
    # Niceness added to the campaign workers. The SES stand-in plays AWS (SES and SNS), whose
    # CPU is not ours in production; on a small machine unthrottled senders starve it.
    sender_nice: int = 0


def run_e2e_scratch(
    settings: Settings, options: E2eOptions, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """On the running stack, in a scratch database (kept for inspection: see the result)."""
    scratch, log_dir = in_scratch(settings, "e2e", log)
    return run_e2e(scratch, options, log, log_dir=log_dir)


def run_e2e(
    settings: Settings,
    options: E2eOptions,
    log: Callable[[str], None] = print,
    *,
    log_dir: Path,
) -> dict[str, Any]:
    assert settings.ses_endpoint_url, "needs the SES stand-in"
    s = with_feedback(settings, feedback_min_sample=options.min_sample)
    events = SesEventsAdmin(settings.ses_endpoint_url)
    run = uuid.uuid4().hex[:8]
    domain = f"e2e-{run}.flashsend.test"
    began = time.monotonic()
    insert_users(s, options.users, domain)
    SesSender(make_client(s, timeout=10)).put_template(*TEMPLATE)
    events.set_rates(
        configuration_set=s.marketing_configuration_set,
        p_bounce=options.p_bounce,
        p_complaint=options.p_complaint,
        salt=run,
    )
    webhook = WebhookProcess.start(s, log_dir)
    sub = events.subscribe(
        webhook.sns_url,
        s.sns_topic_arns[0],
        configuration_sets=[s.marketing_configuration_set],
        event_types=list(options.event_types),
        signature_version=2,
    )
    feedback = WorkerPool(s, log_dir, loglevel="info", role="feedback")
    senders = WorkerPool(s, log_dir, loglevel="warning", nice=options.sender_nice)
    result: dict[str, Any] = {
        "users": options.users,
        "rate": options.rate,
        "sender_nice": options.sender_nice,
        "database": s.pg_database,
    }
    started = StartedCampaigns(s)
    try:
        events.wait_confirmed(sub["id"])
        feedback.start(1)
        senders.start(options.workers)
        c1 = started.add(create_campaign(s, name="e2e-1", template=TEMPLATE[0], rate=options.rate))
        start_campaign(s, c1)
        t_start = time.monotonic()
        log(f"campaign {c1} started at {options.rate:g}/s to {options.users:,} users")

        def settled() -> dict[str, Any] | None:
            if not (feedback.alive() and senders.alive()):
                raise RuntimeError(f"a worker died; logs in {log_dir}")
            row = campaign_row(s, c1)
            return row if row["status"] != "sending" else None

        first = wait_for(f"campaign {c1} to pause itself", settled, options.timeout_s, 0.02)
        t_paused, paused_wall = time.monotonic(), time.time()
        log(f"campaign {c1} {first['status']}: {first['reason']}")
        wait_for("rows in flight", lambda: campaign_row(s, c1)["counts"].get("sending", 0) == 0, 60)
        events.wait_drained(timeout=options.timeout_s)
        wait_for("feedback group caught up", lambda: feedback_lag(s) == 0, options.timeout_s)
        injected = {  # this run's addresses only (the stand-in is shared)
            outcome: [a for a in addresses if a.endswith("@" + domain)]
            for outcome, addresses in events.feedback(str(c1))["addresses"].items()
        }
        expected = {a: "bounce" for a in injected.get("bounce", [])}
        expected.update({a: "complaint" for a in injected.get("complaint", [])})
        got = suppressed(s)
        c1_row = campaign_row(s, c1)
        result["campaign_1"] = {
            "id": c1,
            "status": c1_row["status"],
            "reason": c1_row["reason"],
            "rows": c1_row["counts"],
            "seconds_to_pause": round(t_paused - t_start, 2),
            "feedback": _plain(feedback_counters(s, c1)),
            "injected_bounces": len(injected.get("bounce", [])),
            "injected_complaints": len(injected.get("complaint", [])),
        }
        result.update(_crossing(s, c1, paused_wall if first["status"] == "paused" else None))
        result["suppressed"] = len(got)
        result["suppression_matches"] = got == expected
        result["suppression_missing"] = sorted(set(expected) - set(got))[:20]
        result["suppression_extra"] = sorted(set(got) - set(expected))[:20]
        log(f"suppressed {len(got):,} addresses; exactly the injected ones: {got == expected}")

        if c1_row["status"] == "paused":
            # Measured. A paused campaign keeps its rate in the account's budget, and at rate
            # 0 that is all of it: campaign 2's preflight would refuse to start.
            control_campaign(s, c1, "cancel", "feedback e2e: measured")
        audience = (
            "u.id IN (SELECT user_id FROM campaign_recipients "
            f"WHERE campaign_id = {int(c1)} AND status = 'sent')"
        )
        c2 = started.add(
            create_campaign(s, name="e2e-2", template=TEMPLATE[0], rate=0, audience=audience)
        )
        start_campaign(s, c2)
        c2_row = wait_for(
            f"campaign {c2} to finish",
            lambda: (
                (r := campaign_row(s, c2))["counts"].get("pending", 0)
                + r["counts"].get("sending", 0)
                == 0
                and r
            ),
            options.timeout_s,
            0.2,
        )
        stats = events.stats(campaign=str(c2))
        leaked = [  # every suppressed address, looked up at SES (the stand-in's index)
            a
            for a in got
            if any(
                m["tags"].get("campaign") == str(c2)
                for m in events.messages(destination=a, limit=10)
            )
        ]
        result["campaign_2"] = {
            "id": c2,
            "status": c2_row["status"],
            "rows": c2_row["counts"],
            "audience": c1_row["counts"].get("sent", 0),
            "reached_ses": stats["accepted"],
            "duplicates_at_ses": stats["duplicates"],
            "suppressed_reaching_ses": len(leaked),
        }
        result["ok"] = bool(
            c1_row["status"] == "paused"
            and str(c1_row["reason"] or "").startswith("auto: complaint rate")
            and got == expected
            and not leaked
            and stats["accepted"] == c1_row["counts"].get("sent", 0) - len(got)
        )
        result["webhook"] = webhook.stats()
        result["subscription"] = events.subscription(sub["id"])
        result["seconds"] = round(time.monotonic() - began, 1)
        return result
    except (Exception, KeyboardInterrupt) as exc:
        # Campaign 1 ends paused by design; a run stopped early cancels what it left live.
        senders.stop()
        result["ok"] = False
        return finish_run(result, started, exc, log)
    finally:
        senders.stop()
        feedback.stop()
        webhook.stop()
        events.unsubscribe(sub["id"])
        events.clear_rates(s.marketing_configuration_set)


def _crossing(s: Settings, campaign_id: int, paused_at: float | None) -> dict[str, Any]:
    """seconds_from_crossing_to_pause: from the arrival at the webhook of the event after which
    the campaign's counters cross a threshold (the stand-in's emission of it) to the moment
    this run saw the campaign paused (polled every 20 ms)."""
    crossing = find_crossing(
        read_ses_events(s, s.topic_mail_events), campaign_id, deliverability.thresholds(s)
    )
    if crossing is None:
        return {"seconds_from_crossing_to_pause": None, "crossing": None}
    out: dict[str, Any] = {
        "seconds_from_crossing_to_pause": None,
        "crossing": {
            "event_type": crossing.event_type,
            "reason": crossing.reason,
            "events_before": crossing.events_before,
            # the stand-in's own queue: event built → POSTed (SNS's delay, in production)
            "standin_queue_s": round((crossing.received_at_ms - crossing.occurred_at_ms) / 1000, 2),
        },
    }
    with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM seen_at) FROM feedback_seen WHERE event_id = %s",
            (crossing.event_id,),
        ).fetchone()
    if row is not None:  # the agent's transaction that applied it (paused it, if still sending)
        applied = float(row[0]) - crossing.received_at_ms / 1000
        out["crossing"]["seconds_to_applied"] = round(applied, 2)
    if paused_at is not None:
        out["seconds_from_crossing_to_pause"] = round(paused_at - crossing.received_at_ms / 1000, 2)
    return out


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items()}
