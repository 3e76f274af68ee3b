"""`flashsend demo`: seed users, create and start a campaign, run W real workers, show
progress, and summarise with figures from our tables AND from the SES stand-in (duplicates
and the busiest sliding second are measured at the provider, not trusted from our own rows)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg

from flashsend.errors import FlashsendError, UsageError
from flashsend.lab.demo_schedule import (
    POLL_S,
    DemoScheduler,
    prepare_users,
    schedule_report,
)
from flashsend.lab.push_devices import device_verdict, seed_devices
from flashsend.lab.ramp_figures import bucket_ms, step_windows
from flashsend.lab.run import StartedCampaigns, error_text, finish_run
from flashsend.lab.workers import WorkerPool, wait_joined
from flashsend.progress import ProgressLine
from flashsend.settings import Settings
from producers.campaign import start_campaign
from producers.campaign_ops import (
    DEFAULT_HTML,
    DEFAULT_SUBJECT,
    DEFAULT_TEMPLATE,
    DEFAULT_TEXT,
    PROMO_HTML,
    PROMO_SUBJECT,
    PROMO_TEMPLATE,
    PROMO_TEXT,
    AbTest,
    create_campaign,
    promote,
)
from sinks.campaign_store import SETTLED, CampaignStore
from sinks.promo_store import PromoStore
from sinks.ses import SesSender, make_client
from sinks.users import fill_phones, seed_users
from sinks.variant_store import VariantStore, variants_summary
from streams.rules.ab_test import Variant, choose_winner, winner_due
from streams.rules.ramp import RampStep, format_ramp, parse_ramp
from streams.rules.send_plan import schedule_from_flags

PROGRESS_POLL_S = 2.0  # the progress line's refresh
# A recipient's statuses, each counted in the summary.
STATUSES = ("sent", "failed", "skipped", "unknown", "pending", "sending", "cancelled")


@dataclass(frozen=True)
class DemoOptions:
    users: int = 1_000_000
    rate: float = 0.0
    workers: int = 2
    timeout_s: float = 1800.0
    show_progress: bool = True
    promo_codes: bool = False  # a pool of one code per user, {{promo_code}} in the template
    variants: int = 0  # an A/B test of this many variants (0: none)
    holdout_wait_s: float = 5.0
    local_window: str | None = None  # e.g. "09:00-11:00": users get zones (demo_schedule)
    date: str | None = None
    waves: str | None = None  # e.g. "recent:30m,rest:2d"
    ramp: str = ""  # a rate ramp, as `campaign create --ramp` takes it ("": none)
    channel: str = "email"  # "sms": texts through pinpoint-sms-voice-v2 to users' phones
    rate_unit: str = "messages"  # "segments": an SMS campaign's rate counts segments


# The SMS demo's body: GSM-7, one segment for the demo's names.
SMS_BODY = (
    "Hi {{first_name}}, FLASH SALE -50% today only at shop.flashsend.test. Reply STOP to opt out"
)


# The demo's A/B test: each variant 10 % of the audience, its own template (the subject
# differs); the demo itself decides (winner by manual), see `DemoAbTest`.
VARIANT_PERCENT = 10.0


def demo_ab_test(options: DemoOptions) -> AbTest | None:
    if not options.variants:
        return None
    if not 2 <= options.variants <= 10:
        raise UsageError("--variants takes 2 to 10 (each variant gets 10 % of the audience)")
    names = [chr(ord("A") + i) for i in range(options.variants)]
    return AbTest(
        variants=[Variant(n, f"{DEFAULT_TEMPLATE}_{n}", VARIANT_PERCENT) for n in names],
        holdout_wait_s=options.holdout_wait_s,
        winner_by="manual",
    )


class DemoAbTest:
    """The demo's decider: once the test share is settled (nothing pending or sending, the
    holdout held) and the holdout wait is over, it promotes the variant `choose_winner` picks
    by clicks from the counters the feedback worker keeps (with no feedback worker, or no
    Click events published, every variant ties at 0 and the first one wins), exactly as
    `flashsend campaign promote` would."""

    def __init__(self, settings: Settings, campaign_id: int, log: Any) -> None:
        self.settings = settings
        self.campaign_id = campaign_id
        self.log = log
        self.promoted: str | None = None

    def tick(self, conn: psycopg.Connection[Any], progress: Any) -> None:
        if self.promoted or progress["status"] != "sending" or not progress["held"]:
            return
        if progress["pending"] or progress["sending"]:
            return
        store = VariantStore(conn)
        state = store.state(self.campaign_id)
        if state is None or not winner_due(
            state.snapshot_done_at, state.holdout_wait_s, datetime.now(UTC)
        ):
            return
        winner, _why = choose_winner(store.counts(state), "clicks")
        self.log("\n" + promote(self.settings, self.campaign_id, winner))
        self.promoted = winner


def ensure_users(settings: Settings, wanted: int) -> float:
    """Top the users table up to `wanted` rows; returns seconds spent seeding."""
    with psycopg.connect(settings.pg_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM users").fetchone()
    have = int(row[0]) if row else 0
    if have >= wanted:
        return 0.0
    began = time.monotonic()
    seed_users(settings.pg_dsn, wanted - have)
    return time.monotonic() - began


def _sending_since(settings: Settings, campaign_id: int) -> float | None:
    with psycopg.connect(settings.pg_dsn) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM sending_since)::float8 FROM campaigns WHERE id = %s",
            (campaign_id,),
        ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def ramp_summary(
    settings: Settings, campaign_id: int, ramp: Sequence[RampStep], since: float | None
) -> dict[str, Any]:
    """The ramp and, per step, the busiest sliding second wholly inside it at the stand-in
    (from its per-bucket acceptances: exact to `bucket_ms`)."""
    out: dict[str, Any] = {"ramp": format_ramp(ramp), "steps": [s.to_dict() for s in ramp]}
    stats = standin_stats(settings, campaign_id)
    if since is None or not stats.get("first_ts") or not settings.ses_endpoint_url:
        return out
    from infra.ses_standin.admin import SesStandinAdmin

    bucket = bucket_ms(float(stats["last_ts"]) - float(stats["first_ts"]) + 1.0)
    points = SesStandinAdmin(settings.ses_endpoint_url).rate(str(campaign_id), bucket_ms=bucket)
    out["steps"] = step_windows(points, since, ramp)
    out["bucket_ms"] = bucket
    return out


def standin_stats(settings: Settings, campaign_id: int, channel: str = "email") -> dict[str, Any]:
    if not settings.ses_endpoint_url:
        return {}
    from infra.ses_standin.admin import SesStandinAdmin

    admin = SesStandinAdmin(settings.ses_endpoint_url)
    if channel == "sms":
        return admin.sms_stats(campaign=str(campaign_id))
    if channel == "push":
        return admin.push_stats(campaign=str(campaign_id))
    return dict(admin.stats(campaign=str(campaign_id)))


# A push demo's notification: an hour to live, one per device of this sale (collapse key).
PUSH_TTL_S = 3600
PUSH_COLLAPSE_KEY = "flash-sale"

# Demo pool codes: 23^8 = 7.8e10 possible, sparse enough for 78 million codes.
PROMO_PATTERN = "DEMO-{8}"


def create_pool(settings: Settings, campaign_id: int, count: int) -> None:
    """A pool of `count` generated codes for a draft campaign."""
    from streams.rules.promo_codes import parse_pattern

    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        PromoStore(conn).generate(campaign_id, parse_pattern(PROMO_PATTERN), count)


def promo_verdict(settings: Settings, campaign_id: int, stats: dict[str, Any]) -> dict[str, Any]:
    """Codes issued, and whether each went to one recipient and each recipient got one:
    from our rows (bound codes, sent rows) AND from what the SES stand-in accepted (each code
    at one destination, each destination one code, every accepted mail with a code)."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        db = PromoStore(conn).check(campaign_id)
        sent = CampaignStore(conn).progress(campaign_id)["sent"]
    db_ok = (
        db["distinct_codes"] == db["bound"] == db["holders"]
        and db["holding_two"] == 0
        and db["sent_without_code"] == 0
    )
    at_ses = stats.get("promo_codes")
    ses_ok = not stats or (
        stats.get("promo_code_conflicts") == 0
        and at_ses == stats.get("promo_code_destinations")
        and stats.get("promo_code_recipients") == stats.get("accepted")
    )
    return {
        "promo_codes_issued": db["bound"],
        "promo_codes_unique": bool(db_ok and ses_ok),
        "promo_codes_sent_without_code": db["sent_without_code"],
        "promo_codes_holding_two": db["holding_two"],
        "promo_codes_at_ses": at_ses,
        "promo_code_conflicts_at_ses": stats.get("promo_code_conflicts"),
        "promo_codes_issued_equals_sent": db["bound"] == sent,
    }


def run_demo(settings: Settings, options: DemoOptions, log: Any = print) -> dict[str, Any]:
    """Run the demo; always returns the summary (`error` set when the run failed or was
    interrupted; the campaign is then cancelled, as is one still unfinished at the timeout)."""
    ramp = parse_ramp(options.ramp) if options.ramp else ()  # bad input: refused before anything
    limit = options.rate if options.rate or not ramp else max(s.rate for s in ramp)
    log(
        f"demo: {options.users:,} users, {options.channel}, rate {limit or 'unlimited'}"
        f"{', ramp ' + format_ramp(ramp) if ramp else ''}, "
        f"{options.workers} worker(s), {settings.partitions} partitions"
    )
    if options.channel in ("sms", "push") and (options.promo_codes or options.variants):
        raise UsageError(f"--channel {options.channel} runs without --promo-codes and --variants")
    if options.rate_unit == "segments" and options.channel != "sms":
        raise UsageError("--rate-unit segments is for SMS campaigns (add --channel sms)")
    started = StartedCampaigns(settings)
    summary: dict[str, Any] = {"campaign_id": None, "rate_limit": limit}
    sending_since: float | None = None
    pool = WorkerPool(settings, settings.state_dir / "logs")
    failure: BaseException | None = None
    decider: DemoAbTest | DemoScheduler | None = None
    began = time.monotonic()
    try:
        seed_s = ensure_users(settings, options.users)
        if seed_s:
            log(f"seeded users in {seed_s:.1f}s")
        if options.channel == "sms":
            fill_phones(settings.pg_dsn, options.users)
        if options.channel == "push":
            summary.update(seed_devices(settings, options.users))
        ses = SesSender(make_client(settings, timeout=10))
        ses.put_template(DEFAULT_TEMPLATE, DEFAULT_SUBJECT, DEFAULT_HTML, DEFAULT_TEXT)
        template = DEFAULT_TEMPLATE
        body = (DEFAULT_SUBJECT, DEFAULT_HTML, DEFAULT_TEXT)
        if options.promo_codes:
            ses.put_template(PROMO_TEMPLATE, PROMO_SUBJECT, PROMO_HTML, PROMO_TEXT)
            template = PROMO_TEMPLATE
            body = (PROMO_SUBJECT, PROMO_HTML, PROMO_TEXT)
        ab = demo_ab_test(options)
        schedule = schedule_from_flags(options.local_window, options.date, options.waves)
        if schedule is not None:
            prepare_users(settings, schedule, options.users)
        for v in ab.variants if ab else ():
            ses.put_template(v.template, f"[{v.name}] {body[0]}", body[1], body[2])
        # The audience is the first N users, so --users means the same on a bigger database.
        audience = f"({settings.audience_condition}) AND u.id <= {int(options.users)}"
        campaign_id = started.add(
            create_campaign(
                # An SMS demo keeps quiet hours only with --local-window (then that window is
                # each row's deadline): otherwise it would wait for morning in the users' zone.
                settings.model_copy(update={"sms_send_hours": "", "push_send_hours": ""}),
                name=f"demo-{int(time.time())}",
                template=SMS_BODY if options.channel in ("sms", "push") else template,
                push_ttl_s=PUSH_TTL_S if options.channel == "push" else None,
                push_collapse_key=PUSH_COLLAPSE_KEY if options.channel == "push" else None,
                rate=limit,
                audience=audience,
                ab=ab,
                schedule=schedule,
                ramp=ramp,
                channel=options.channel,
                rate_unit=options.rate_unit,
            )
        )
        summary["campaign_id"] = campaign_id
        if options.promo_codes:
            pool_began = time.monotonic()
            create_pool(settings, campaign_id, options.users)  # the audience is at most that
            log(f"promo pool: {options.users:,} codes in {time.monotonic() - pool_began:.1f}s")
        decider = DemoAbTest(settings, campaign_id, log) if ab else None
        if schedule is not None:
            decider = DemoScheduler(settings, campaign_id, log)
        pool.start(options.workers)
        # Started together, the workers would rebalance in the campaign's first seconds (a
        # moved partition holds its sends a second): the figures are the steady state's.
        joined = wait_joined(settings, options.workers)
        log(
            f"{options.workers} worker(s) joined in {joined:.1f}s"
            if joined is not None
            else "workers still joining after 60s; starting anyway"
        )
        summary["workers_joined_s"] = None if joined is None else round(joined, 1)
        began = time.monotonic()
        bar = ProgressLine(f"campaign {campaign_id} produce") if options.show_progress else None
        start = start_campaign(
            settings, campaign_id, progress=(lambda d, t: bar.update(d, t)) if bar else None
        )
        if bar:
            bar.close()
        if ramp:
            sending_since = _sending_since(settings, campaign_id)
        log(
            f"snapshot {start.recipients:,} recipients in {start.snapshot_s:.1f}s, "
            f"produced {start.produced:,} in {start.produce_s:.1f}s"
        )
        summary["snapshot_s"] = round(start.snapshot_s, 2)
        summary["produce_s"] = round(start.produce_s, 2)
        wait_until_finished(settings, campaign_id, pool, options, began, decider)
        if isinstance(decider, DemoScheduler):
            summary["clock_jumps"] = decider.jumps
    except (Exception, KeyboardInterrupt) as exc:
        failure = exc
    finally:
        pool.stop()
        if isinstance(decider, DemoScheduler):
            decider.close()
    summary["elapsed_s"] = round(time.monotonic() - began, 2)
    summary = finish_run(summary, started, failure, log)
    if summary["campaign_id"] is not None:
        try:
            summary.update(_final_counts(settings, summary["campaign_id"], options))
            if ramp:
                summary["ramp"] = ramp_summary(
                    settings, summary["campaign_id"], ramp, sending_since
                )
        except (psycopg.Error, OSError) as exc:
            summary["error"] = "; ".join(
                filter(None, [summary.get("error"), f"final counts: {error_text(exc)}"])
            )
    summary.update(
        {
            "workers": options.workers,
            "partitions": settings.partitions,
            "worker_rss_mb_max": round(pool.max_rss_mb, 1),
        }
    )
    return summary


def _final_counts(
    settings: Settings, campaign_id: int, options: DemoOptions | None = None
) -> dict[str, Any]:
    """Counts per status from our rows, duplicates and the busiest second from the stand-in."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        progress = CampaignStore(conn).progress(campaign_id)
    channel = options.channel if options is not None else "email"
    stats = standin_stats(settings, campaign_id, channel)
    promo = (
        promo_verdict(settings, campaign_id, stats)
        if options is not None and options.promo_codes
        else {}
    )
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        ab = variants_summary(VariantStore(conn), campaign_id)
    extra: dict[str, Any] = schedule_report(settings, campaign_id)
    if ab is not None:
        extra |= {
            "variants": ab["variants"],
            "winner": ab["winner"],
            "winner_reason": ab["winner_reason"],
            "held": progress["held"],
        }
    if channel == "push":
        extra |= device_verdict(settings, campaign_id, stats)
    return {
        **promo,
        **extra,
        "recipients": progress.total,
        **{status: progress[status] for status in STATUSES},
        "duplicates": stats.get("duplicates"),
        "accepted_by_ses": stats.get("accepted"),
        "send_rate_per_s": round(progress.send_rate, 1),
        "max_1s_window": stats.get("max_1s_window"),
        "status": progress["status"],
        # How SES events came back while it sent (webhook: one signed SNS POST each;
        # firehose: batches): the stand-in's delivery work shares the cores with the senders.
        "events_ingest": settings.events_ingest,
        **(
            {
                "channel": "sms",
                "rate_unit": progress["rate_unit"],
                "segments": stats.get("segments"),
                "max_1s_window_segments": stats.get("max_1s_window_segments"),
            }
            if channel == "sms"
            else {}
        ),
    }


def wait_until_finished(
    settings: Settings,
    campaign_id: int,
    pool: WorkerPool,
    options: DemoOptions,
    began: float,
    decider: DemoAbTest | DemoScheduler | None = None,
) -> Any:
    bar = ProgressLine(f"campaign {campaign_id} send   ") if options.show_progress else None
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        store = CampaignStore(conn)
        while True:
            progress = store.progress(campaign_id)
            if decider is not None:
                decider.tick(conn, progress)
            pool.sample_rss()
            if bar:
                bar.update(
                    progress.terminal,
                    progress.total,
                    f"{progress.send_rate:,.0f}/s sent={progress['sent']:,}",
                )
            if progress.finished or progress["status"] in SETTLED:
                if progress.finished and progress["status"] == "sending":
                    store.finish(campaign_id)
                    progress = store.progress(campaign_id)
                break
            if not pool.alive():
                raise FlashsendError(f"all workers exited; see {pool.log_dir}")
            if time.monotonic() - began > options.timeout_s:
                break
            time.sleep(POLL_S if isinstance(decider, DemoScheduler) else PROGRESS_POLL_S)
    if bar:
        bar.update(progress.terminal, progress.total, f"{progress.send_rate:,.0f}/s", force=True)
        bar.close()
    return progress
