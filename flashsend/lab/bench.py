"""`flashsend bench`: every headline figure measured in one run on the local stack, side by
side with the naive approach (one SES SendEmail per user in a loop).

The runs, in order: the main campaign (rate unlimited; its status query is timed while it
sends), the limiter sweep (flashsend/lab/limiter_sweep.py), pause/resume cycles at a limit and at
full speed (flashsend/lab/pause_latency.py), then the naive loop. How each figure is computed:
flashsend/lab/bench_figures.py; CPU by component: flashsend/lab/bench_campaign.py.

Whatever stops a run (a failure, Ctrl-C), it ends with the workers stopped, the stand-in's
faults restored, its campaigns cancelled if unfinished, and a result carrying `error`.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from flashsend.errors import UsageError
from flashsend.lab.bench_campaign import run_campaign
from flashsend.lab.bench_figures import DEFAULT_SWEEP_RATES, DEFAULT_SWEEP_SECONDS, worst_ratio
from flashsend.lab.demo import ensure_users
from flashsend.lab.events_lag import EVENTS_LAG_KEYS, events_lag, standin_dropped
from flashsend.lab.feedback_run import end_offsets
from flashsend.lab.limiter_sweep import run_sweep
from flashsend.lab.partition_stalls import campaign_stall
from flashsend.lab.pause_latency import check_clock, pause_figures, pause_run
from flashsend.lab.run import StartedCampaigns, error_text, finish_run
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from infra.ses_standin.admin import SesStandinAdmin
from producers.resend_unknown import feedback_lag
from producers.topics import admin_client
from sinks.ses import SesSender, make_client

SEED_SNAPSHOT_SQL = """
INSERT INTO bench_seed_recipients (campaign_id, seq, user_id, email)
SELECT 42, row_number() OVER (ORDER BY u.id), u.id, u.email
  FROM users u
 WHERE u.status = 'active' AND u.marketing_opt_in
   AND NOT EXISTS (SELECT 1 FROM email_suppressions s WHERE s.email = u.email)
"""

SEED_TABLE = """
CREATE TABLE bench_seed_recipients (
  campaign_id bigint NOT NULL, seq int NOT NULL, user_id bigint NOT NULL, email text NOT NULL,
  status text NOT NULL DEFAULT 'pending', claimed_at timestamptz, sent_at timestamptz,
  PRIMARY KEY (campaign_id, seq), UNIQUE (campaign_id, user_id))
"""

# Seconds of sending each pause cycle needs at a rate, with room for the ramp-up after each
# resume and the settling after each pause (pause_latency.py).
PAUSE_CYCLE_SENDING_S = 2.0


@dataclass(frozen=True)
class BenchOptions:
    users: int = 1_000_000
    workers: int = 2
    ses_latency_ms: int = 0
    naive_users: int = 20_000
    sweep_rates: tuple[float, ...] = DEFAULT_SWEEP_RATES
    sweep_seconds: float = DEFAULT_SWEEP_SECONDS
    pauses: int = 5  # per rate
    pause_rate: float = 1000.0
    out_dir: Path = Path("bench/results")
    # The event loop: a feedback worker applies the main campaign's SES events while it sends;
    # events_lag_* measure how far behind it is, and its CPU is the product's.
    events: bool = True
    # The run refuses to start unless the stack's Kafka has this many brokers (None: any).
    brokers: int | None = None


def broker_count(settings: Settings) -> int:
    admin = admin_client(settings.kafka_bootstrap)
    return len(admin.list_topics(timeout=10).brokers)


def seed_snapshot_s(settings: Settings) -> float:
    """The seed document's own snapshot SQL on the same users, into the seed's table shape."""
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_seed_recipients")
        conn.execute(SEED_TABLE)
        began = time.perf_counter()
        conn.execute(SEED_SNAPSHOT_SQL)
        elapsed = time.perf_counter() - began
        conn.execute("DROP TABLE bench_seed_recipients")
    return elapsed


# A fixed piece of pure-Python work (JSON, hashing, dicts: what a worker does per call).
_REFERENCE_DOC = {
    "FromEmailAddress": "deals@mail.flashsend.test",
    "BulkEmailEntries": [
        {"Destination": {"ToAddresses": [f"user{i}@mail.flashsend.test"]}, "Tags": {"seq": i}}
        for i in range(50)
    ],
}


REFERENCE_UNDER_LOAD_AFTER_S = 30.0


def machine_reference_ms(rounds: int = 9, loops: int = 400) -> float:
    """CPU milliseconds this process spends on a fixed workload (the median of `rounds`).

    This machine's speed drifts by 20-30 % within an hour (shared cores): the same code's CPU
    per recipient moves with it. Taken at the start, while the 1M campaign sends and at the
    end of a bench, it helps tell which runs are comparable; it is not part of any target."""
    times = []
    for _ in range(rounds):
        began = time.process_time()
        for i in range(loops):
            body = json.dumps(_REFERENCE_DOC).encode()
            hashlib.sha256(body + i.to_bytes(4, "big")).digest()
            json.loads(body)
        times.append((time.process_time() - began) * 1000)
    return round(statistics.median(times), 1)


def naive_rate(settings: Settings, users: int) -> float:
    """The pattern the seed warns against: one SendEmail per user, in a loop."""
    ses = SesSender(make_client(settings, timeout=10))
    with psycopg.connect(settings.pg_dsn) as conn:
        emails = [
            r[0]
            for r in conn.execute(
                "SELECT email FROM users WHERE status = 'active' AND marketing_opt_in "
                "AND email LIKE 'user%%' ORDER BY id LIMIT %s",
                (users,),
            )
        ]
    began = time.perf_counter()
    for email in emails:
        ses.send_templated(
            from_address=settings.from_address,
            to=email,
            template="flash_sale",
            data={"first_name": "there"},
            tags={"campaign": "naive"},
        )
    return len(emails) / (time.perf_counter() - began)


Series = list[tuple[float, int]]  # (bucket start, recipients accepted in that second)


def plot(
    result: dict[str, Any], rate_series: Series, limiter_series: dict[float, Series], path: Path
) -> None:
    """Three panels: the unlimited campaign's rate, each limiter run against its limit, and
    the per-stage timings."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 4.5))
    _rate_line(ax1, rate_series, "sent/s")
    ax1.set_ylabel("recipients per second (at the SES stand-in)")
    ax1.set_title(
        f"{result.get('recipients', 0):,} recipients, rate unlimited, {result['workers']} workers"
    )
    ax1.legend()
    ratios = {row["rate"]: row["ratio"] for row in result.get("limiter_sweep", [])}
    for limit, series in sorted(limiter_series.items()):
        line = _rate_line(ax2, series, f"limit {limit:,g}/s (ratio {ratios.get(limit)})")
        color = line.get_color() if line is not None else "grey"
        ax2.axhline(limit, linestyle="--", linewidth=0.8, color=color)
    ax2.set_yscale("log")
    ax2.set_ylabel("recipients per second")
    ax2.set_title("limiter: accepted per second against the limit (dashed)")
    ax2.legend(fontsize="small")
    stages = ["snapshot_s", "produce_s", "send_s", "end_to_end_s"]
    ax3.bar(stages, [float(result.get(s) or 0) for s in stages])
    ax3.set_ylabel("seconds")
    ax3.set_title("per-stage timings")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _rate_line(ax: Any, series: Series, label: str) -> Any:
    """Plot a per-second series from its first second; the line, or None if it is empty."""
    if not series:
        return None
    t0 = series[0][0]
    (line,) = ax.plot([t - t0 for t, _ in series], [n for _, n in series], label=label)
    ax.set_xlabel("seconds since first send")
    return line


MAIN_KEYS = (
    "recipients",
    "sent",
    "unknown",
    "pending",
    "duplicates",
    "snapshot_s",
    "produce_s",
    "send_rate_per_s",
    "end_to_end_s",
    "end_to_end_rate_per_s",
    "status_query_ms",
    "feedback_gate",
    "cpu_us_per_recipient",
    "cpu_us_per_recipient_product",
    "cpu_us_per_recipient_by_component",
    "pg_statements",
    "services",
    *EVENTS_LAG_KEYS,
)


def run_bench(
    settings: Settings, options: BenchOptions, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Every figure in one run; always returns the result (`error` set when the run failed
    or was interrupted), with the campaigns it started finished or cancelled."""
    ses = SesStandinAdmin(settings.ses_endpoint_url or "")
    result: dict[str, Any] = {
        "users": options.users,
        "workers": options.workers,
        "partitions": settings.partitions,
        "ses_latency_ms": options.ses_latency_ms,
        # How SES events came back (webhook: a signed SNS POST each; firehose: batches).
        "events_ingest": settings.events_ingest if options.events else None,
    }
    started = StartedCampaigns(settings)
    log_dir = settings.state_dir / "logs" / f"bench-{int(time.time())}"
    pool = WorkerPool(settings, log_dir)
    feedback = WorkerPool(settings, log_dir, role="feedback")
    faults_before: dict[str, Any] | None = None
    rate_series: Series = []
    limiter_series: dict[float, Series] = {}
    failure: BaseException | None = None
    try:
        result["brokers"] = broker_count(settings)
        if options.brokers is not None and result["brokers"] != options.brokers:
            raise UsageError(
                f"the stack's Kafka has {result['brokers']} broker(s), not {options.brokers}: "
                f"run `flashsend down`, then `FLASHSEND_KAFKA_BROKERS={options.brokers} "
                "flashsend up`"
            )
        faults_before = dict(ses.faults())
        ses.set_faults(
            latency_ms=options.ses_latency_ms, jitter_ms=0, p429=0, p_transient=0, p_hang=0
        )
        from producers.campaign_ops import (
            DEFAULT_HTML,
            DEFAULT_SUBJECT,
            DEFAULT_TEMPLATE,
            DEFAULT_TEXT,
        )

        SesSender(make_client(settings, timeout=10)).put_template(
            DEFAULT_TEMPLATE, DEFAULT_SUBJECT, DEFAULT_HTML, DEFAULT_TEXT
        )
        ensure_users(settings, options.users)
        result["machine_reference_ms"] = {"start": machine_reference_ms()}
        log(
            f"bench: {options.users:,} users, {options.workers} workers, "
            f"SES latency {options.ses_latency_ms} ms"
        )
        pool.start(options.workers)
        if options.events:
            feedback.start(1)
        time.sleep(8)  # let the workers join the group before the clock starts
        log("bench: seed snapshot SQL on the same data")
        result["seed_snapshot_s"] = round(seed_snapshot_s(settings), 2)
        rate_series = _main_campaign(settings, options, pool, feedback, started, result, log)
        limiter_series = _limiter_sweep(settings, options, pool, started, result, log)
        _pauses(settings, options, started, result, log)
        result["worker_rss_mb_max"] = round(pool.max_rss_mb, 1)
        pool.stop()
        log(f"bench: naive loop over {options.naive_users:,} users")
        result["naive_users"] = options.naive_users
        result["naive_rate_per_s"] = round(naive_rate(settings, options.naive_users), 1)
        result["speedup_vs_naive"] = round(
            result["send_rate_per_s"] / result["naive_rate_per_s"], 1
        )
        result["machine_reference_ms"]["end"] = machine_reference_ms()
    except (Exception, KeyboardInterrupt) as exc:
        failure = exc
    finally:
        pool.stop()
        feedback.stop()
        if faults_before is not None:
            try:
                ses.set_faults(
                    latency_ms=faults_before["latency_ms"], jitter_ms=faults_before["jitter_ms"]
                )
            except OSError as exc:
                result["cleanup_error"] = f"stand-in faults not restored: {error_text(exc)}"
    result = finish_run(result, started, failure, log)
    _write_files(result, options.out_dir, rate_series, limiter_series)
    return result


def _main_campaign(
    settings: Settings,
    options: BenchOptions,
    pool: WorkerPool,
    feedback: WorkerPool,
    started: StartedCampaigns,
    result: dict[str, Any],
    log: Callable[[str], None],
) -> Series:
    log(f"bench: main campaign to the first {options.users:,} users, rate unlimited")
    events_from = end_offsets(settings, settings.topic_mail_events) if options.events else {}
    # Older events the agent applies first; while it is behind, campaign calls wait.
    result["events_backlog_at_start"] = feedback_lag(settings) if options.events else None
    dropped_from = standin_dropped(settings) if options.events else None

    def settle(campaign_id: int) -> dict[str, Any]:
        if not options.events:
            return dict.fromkeys(EVENTS_LAG_KEYS)
        log("bench: waiting for the campaign's events to be applied (events_lag)")
        return events_lag(settings, events_from, campaign_id, dropped_from=dropped_from)

    # Once more while the main campaign sends: the machine's drift shows under load (the
    # idle figures at start and end stayed put while CPU per recipient moved by 30 %).
    under_load: list[float] = []
    timer = threading.Timer(
        REFERENCE_UNDER_LOAD_AFTER_S, lambda: under_load.append(machine_reference_ms())
    )
    timer.daemon = True  # never holds the process open if the campaign fails
    timer.start()
    audience = f"({settings.audience_condition}) AND u.id <= {int(options.users)}"
    try:
        main = run_campaign(
            settings,
            pool,
            started,
            0.0,
            audience=audience,
            sample_status=True,
            statements=True,
            others={"feedback_worker": feedback} if options.events else None,
            settle=settle,
        )
    finally:
        timer.cancel()
        timer.join()
    result["machine_reference_ms"]["sending"] = under_load[0] if under_load else None
    result.update({k: main[k] for k in MAIN_KEYS})
    stall = campaign_stall(settings.pg_dsn, main["campaign_id"], settings.partitions)
    result["partition_stall"] = stall.as_dict()
    result["produce_rate_per_s"] = round(main["recipients"] / max(main["produce_s"], 1e-9))
    result["send_s"] = round(main["sent"] / max(main["send_rate_per_s"], 1e-9), 1)
    ses = SesStandinAdmin(settings.ses_endpoint_url or "")
    return ses.rate(str(main["campaign_id"]), 1000)


def _limiter_sweep(
    settings: Settings,
    options: BenchOptions,
    pool: WorkerPool,
    started: StartedCampaigns,
    result: dict[str, Any],
    log: Callable[[str], None],
) -> dict[float, Series]:
    rows, series = run_sweep(
        settings, pool, started, options.sweep_rates, options.sweep_seconds, log
    )
    result["limiter_sweep"] = rows
    result["limiter_worst_ratio"] = worst_ratio(rows)
    result["limiter_worst_avg_ratio"] = min(
        (r["avg_ratio"] for r in rows if r["avg_ratio"] is not None), default=None
    )
    return series


def _pauses(
    settings: Settings,
    options: BenchOptions,
    started: StartedCampaigns,
    result: dict[str, Any],
    log: Callable[[str], None],
) -> None:
    """At the limit first, full speed last: a cancelled full-speed campaign leaves the most
    doorbells behind, which every later campaign's workers read through first."""
    if options.pauses <= 0:
        return
    ses = SesStandinAdmin(settings.ses_endpoint_url or "")
    clock = check_clock(ses)
    runs = []
    full_speed = max(float(result.get("send_rate_per_s") or 0.0), 1000.0)
    for rate, speed in ((options.pause_rate, options.pause_rate), (0.0, full_speed)):
        recipients = round(speed * PAUSE_CYCLE_SENDING_S * (options.pauses + 2))
        runs.append(pause_run(settings, started, rate, options.pauses, recipients, log))
    result["pause_latency_ms"] = pause_figures(runs, clock)


def _write_files(
    result: dict[str, Any], out_dir: Path, rate_series: Series, limiter_series: dict[float, Series]
) -> None:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    files = [out_dir / f"{stamp}.json"]
    if "error" not in result:
        plot(result, rate_series, limiter_series, out_dir / f"{stamp}.png")
        files.append(out_dir / f"{stamp}.png")
    result["files"] = [str(f) for f in files]
    files[0].write_text(json.dumps(result, indent=2))
