"""One measured campaign for `flashsend bench`: rates, timings, the status query sampled while
it sends, and CPU per recipient by component from process CPU times.

CPU is measured per component — workers, broker, PostgreSQL (all backends), the webhook, the
feedback worker and the schema registry when they run (the product) and the SES stand-in (the
test double, which real SES would replace) — as summed process CPU time divided by recipients
sent, because all of them share the same two cores.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import psutil
import psycopg

from flashsend.lab import pg_statements
from flashsend.lab.bench_figures import gate_share, summary
from flashsend.lab.demo import ensure_users, standin_stats
from flashsend.lab.run import StartedCampaigns
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from producers.campaign import start_campaign
from producers.campaign_ops import create_campaign
from sinks.campaign_store import CampaignStore, Progress
from streams.rules.feedback_lag import REPORT_FRESH_S, FeedbackGate

# Progress is read from trigger-kept counters (a few hundred rows whatever the campaign's
# size), so polling it often costs nothing measurable.
PROGRESS_POLL_S = 0.5
STATUS_SAMPLE_S = 0.25  # how often the status query is timed while the campaign sends
STANDIN = "ses_standin"
# Services whose processes are counted; the stand-in is reported apart from the product.
SERVICES = ("kafka", "postgres", "webhook", "registry", "ses")


def stack_pids(
    settings: Settings, workers: WorkerPool, others: Mapping[str, WorkerPool] | None = None
) -> dict[str, list[int]]:
    """Every running process of the stack by component (a service that is not running is
    absent): workers, kafka, postgres (+ backends), webhook, registry, ses_standin, and the
    `others` pools by their names (e.g. the feedback worker)."""
    run = settings.state_dir / "run"
    roots: dict[str, list[int]] = {"workers": [p.pid for p in workers.alive()]}
    for name, pool in (others or {}).items():
        roots[name] = [p.pid for p in pool.alive()]
    for name in SERVICES:
        if name == "postgres":
            pid_file = settings.state_dir / "postgres" / "data" / "postmaster.pid"
        else:
            pid_file = run / f"{name}.pid"
        try:
            pid = int(pid_file.read_text().split()[0])
        except (FileNotFoundError, ValueError, IndexError, PermissionError):
            continue
        if psutil.pid_exists(pid):
            roots[STANDIN if name == "ses" else name] = [pid]
    return roots


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU of the processes and all their descendants, live or reaped."""
    total = 0.0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:
                t = p.cpu_times()
                total += (
                    t.user
                    + t.system
                    + getattr(t, "children_user", 0.0)
                    + getattr(t, "children_system", 0.0)
                )
        except psutil.Error:
            continue
    return total


def cpu_by_component(roots: dict[str, list[int]]) -> dict[str, float]:
    return {name: cpu_seconds(pids) for name, pids in roots.items()}


def cpu_figures(cpu_parts: dict[str, float], sent: int) -> dict[str, Any]:
    """CPU µs per recipient sent: the whole stack, the product alone, and by component."""
    per = max(1, sent)
    product = sum(v for k, v in cpu_parts.items() if k != STANDIN)
    return {
        "cpu_s": round(sum(cpu_parts.values()), 1),
        "cpu_us_per_recipient": round(sum(cpu_parts.values()) / per * 1e6, 1),
        "cpu_us_per_recipient_product": round(product / per * 1e6, 1),
        "cpu_us_per_recipient_by_component": {
            k: round(v / per * 1e6, 1) for k, v in sorted(cpu_parts.items())
        },
        "services": sorted(cpu_parts),
    }


def audience_of(settings: Settings, recipients: int) -> str:
    """An audience of about `recipients` users (the first ones by id that the default audience
    condition takes), seeding users when there are not enough."""
    wanted = max(1, int(recipients))
    cut = (
        f"SELECT u.id FROM users u WHERE {settings.audience_condition} "
        "ORDER BY u.id OFFSET %s LIMIT 1"
    )
    while True:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            row = conn.execute(cut, (wanted - 1,)).fetchone()
            have_row = conn.execute("SELECT count(*) FROM users").fetchone()
        if row is not None:
            return f"({settings.audience_condition}) AND u.id <= {int(row[0])}"
        have = int(have_row[0]) if have_row else 0
        ensure_users(settings, max(have + 1_000, math.ceil(have + wanted * 1.3)))


class StatusSampler:
    """Times `campaign status`'s query (CampaignStore.progress) every STATUS_SAMPLE_S while
    the campaign sends; a sample counts only if the campaign was still sending. At each
    sample it also reads the feedback agent's lag as the workers do (the same statement,
    the same FeedbackGate rule, at their poll interval): whether their gate is closed."""

    def __init__(self, settings: Settings, campaign_id: int) -> None:
        self.settings = settings
        self.campaign_id = campaign_id
        self.samples_ms: list[float] = []
        self.gate_samples: list[tuple[float, bool]] = []
        self._gate = FeedbackGate(settings.feedback_max_lag_s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="status-sampler", daemon=True)

    def __enter__(self) -> StatusSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with (
            contextlib.suppress(psycopg.Error),
            psycopg.connect(self.settings.pg_dsn, autocommit=True) as conn,
        ):
            store = CampaignStore(conn)
            while not self._stop.is_set():
                began = time.perf_counter()
                p = store.progress(self.campaign_id)
                elapsed_ms = (time.perf_counter() - began) * 1000
                if p.finished:
                    return
                if p["status"] == "sending" and p["sent"] > 0:
                    self.samples_ms.append(elapsed_ms)
                    lag = store.feedback_lag(REPORT_FRESH_S)
                    self.gate_samples.append((time.monotonic(), self._gate.update(lag)))
                self._stop.wait(STATUS_SAMPLE_S)


def _progress(settings: Settings, cid: int) -> Progress:
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        return CampaignStore(conn).progress(cid)


def wait_finished(settings: Settings, cid: int, pool: WorkerPool, timeout: float) -> Progress:
    deadline = time.monotonic() + timeout
    while True:
        p = _progress(settings, cid)
        pool.sample_rss()
        if p.finished or time.monotonic() > deadline:
            return p
        if not pool.alive():
            raise RuntimeError(f"all workers exited; see {pool.log_dir}")
        time.sleep(PROGRESS_POLL_S)


def run_campaign(
    settings: Settings,
    pool: WorkerPool,
    started: StartedCampaigns,
    rate: float,
    *,
    audience: str,
    timeout: float = 1800,
    sample_status: bool = False,
    others: Mapping[str, WorkerPool] | None = None,
    settle: Callable[[int], dict[str, Any]] | None = None,
    statements: bool = False,
) -> dict[str, Any]:
    """Create, start and wait for one campaign; its figures from our rows, the stand-in and
    the processes' CPU times. `settle(campaign_id)` runs once the campaign is finished and
    before the CPU is read (e.g. waiting for its events to be applied, so their processing
    is counted); its figures join the result. With `statements`, the result has
    `pg_statements`: the statements with the most server time over the run."""
    cid = started.add(
        create_campaign(
            settings, name=f"bench-{rate:g}-{int(time.time())}", rate=rate, audience=audience
        )
    )
    roots = stack_pids(settings, pool, others)
    counting = statements and pg_statements.reset(settings.pg_dsn)
    cpu0 = cpu_by_component(roots)
    sampler = StatusSampler(settings, cid)
    with sampler if sample_status else contextlib.nullcontext():
        start = start_campaign(settings, cid)
        p = wait_finished(settings, cid, pool, timeout)
    if p.finished and p["status"] == "sending":
        # What reconcile would do on its next tick; the next campaign's preflight counts the
        # rate of every live campaign against the account's budget.
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            CampaignStore(conn).finish(cid)
    settled = settle(cid) if settle is not None else {}
    cpu1 = cpu_by_component(roots)
    cpu_parts = {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1}
    stats = standin_stats(settings, cid)
    # Campaign started (the start command's transaction) → its last send, both on
    # PostgreSQL's clock: not the harness's poll interval.
    end_to_end = None
    if p["started_at"] is not None and p["last_sent_epoch"] is not None:
        end_to_end = float(p["last_sent_epoch"]) - p["started_at"].timestamp()
    result: dict[str, Any] = {
        "campaign_id": cid,
        "rate_limit": rate,
        "recipients": p.total,
        "sent": p["sent"],
        "pending": p["pending"],
        "sending": p["sending"],
        "unknown": p["unknown"],
        "snapshot_s": round(start.snapshot_s, 2),
        "produce_s": round(start.produce_s, 2),
        "send_rate_per_s": round(p.send_rate, 1),
        "end_to_end_s": None if end_to_end is None else round(end_to_end, 2),
        "end_to_end_rate_per_s": round(p.total / end_to_end, 1) if end_to_end else None,
        **cpu_figures(cpu_parts, p["sent"]),
        "duplicates": stats.get("duplicates"),
        "max_1s_window": stats.get("max_1s_window"),
    }
    if sample_status:
        result["status_query_ms"] = summary(sampler.samples_ms, listed=False)
        result["feedback_gate"] = gate_share(sampler.gate_samples).as_dict()
    if statements:
        top = pg_statements.top(settings.pg_dsn, p["sent"]) if counting else None
        result["pg_statements"] = top
    result.update(settled)
    return result
