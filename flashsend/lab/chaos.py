"""`flashsend chaos`: a campaign under faults, judged by the provider's own record.

While the campaign runs: SIGKILL a worker every `kill_every_s` (a supervisor starts a
replacement, as systemd would), stop and restart the broker (same data dir) and PostgreSQL
(immediate shutdown = crash recovery), optionally freeze a worker past the rebalance (zombie)
and let the SES stand-in accept calls without answering. Then wait for the campaign to finish
(reconcile turns expired leases into `unknown`) and check the invariants:

- duplicates == 0 (counted by the stand-in, per destination);
- with a promo pool (`promo_codes`), promo_codes_unique: no code bound to two recipients nor
  mailed to two addresses, no recipient holding or receiving two, nothing sent without one;
- lost == 0 (no recipient left pending/sending);
- every row that ended `unknown` when its lease expired (reason `lease_expired`: its worker
  died or froze in a call) was in a call right after one of the kills, the freeze or a
  worker's own exit (entering a call renews the lease, so a live worker's call is never
  reaped). Right after each, the run reads the campaign's rows in a call (`sending` with
  `in_call_at`): the stopped worker's are among them, and they stay so until the lease turns
  them `unknown`. A kill while PostgreSQL is down is read once it answers again, then counting
  the rows the lease has turned `unknown` meanwhile too. `in_flight_at_kills` is the union of
  those reads, at most MAX_ENTRIES per lane with a call in flight; `unknown_bound` adds the
  rows of calls with no answer (their own reason: timeouts, hung calls, dropped connections).

`invariants` names each check; `invariants_failed` lists those that do not hold.

With the event loop (`events_wait_s` > 0: a webhook process and a feedback worker), SES's
events settle the rows in doubt as in production; after the run every row that is or was
unknown is looked up at the stand-in, the run waits (bounded) for the accepted ones to be
settled, and more invariants hold: no accepted row is still unknown, no row was settled
without the stand-in having accepted it, and accepted_by_ses == sent
(flashsend/chaos_events.py).

The faults combine freely: restarts run in the background while kills go on, the kill
schedule picks the frozen worker only when no other is alive, a restart may fail. Whatever
happens, the run restarts what it stopped, cancels its campaign if unfinished and returns a
result (with `error` when the run itself failed).
"""

from __future__ import annotations

import os
import random
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg

from flashsend.lab.chaos_events import EventLoop, judge_in_doubt
from flashsend.lab.demo import create_pool, ensure_users, promo_verdict, standin_stats
from flashsend.lab.run import StartedCampaigns, error_text, finish_run
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from infra.kafka import KafkaBroker
from infra.postgres import PostgresServer
from infra.ses_standin.admin import SesStandinAdmin
from infra.ses_standin.events_admin import SesEventsAdmin
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
    create_campaign,
)
from producers.reconcile import Reconciler
from sinks.campaign_store import CampaignStore
from sinks.ses import SesSender, make_client
from streams.sender import MAX_ENTRIES

DOWN_S = 3.0  # how long the broker or PostgreSQL stays stopped
ZOMBIE_FROZEN_S = 15.0  # past session.timeout: the frozen worker's partitions are reassigned


@dataclass(frozen=True)
class ChaosOptions:
    users: int = 200_000
    workers: int = 3
    rate: float = 0.0
    kill_every_s: float = 5.0
    restart_broker_at: float | None = None
    restart_postgres_at: float | None = None
    zombie_at: float | None = None
    ses_hang_rate: float = 0.0
    lease_s: float = 20.0
    timeout_s: float = 900.0
    seed: int = 7
    events_wait_s: float = 30.0  # 0: no event loop (no webhook, no feedback worker)
    promo_codes: bool = False  # a promo pool: invariant promo_codes_unique


def freeze(proc: subprocess.Popen[bytes]) -> bool:
    """SIGSTOP a worker (it becomes a zombie once its partitions move); False if it is gone."""
    if proc.poll() is not None:
        return False
    try:
        os.kill(proc.pid, signal.SIGSTOP)
    except ProcessLookupError:
        return False
    return True


def thaw(proc: subprocess.Popen[bytes]) -> bool:
    """SIGCONT a frozen worker; False if something (the kill schedule) ended it meanwhile."""
    if proc.poll() is not None:
        return False
    try:
        os.kill(proc.pid, signal.SIGCONT)
    except ProcessLookupError:
        return False
    return True


T = TypeVar("T")


def pick_victim(rng: random.Random, alive: list[T], frozen: T | None) -> T:
    """The worker to kill: any but the frozen one while another is alive. Thawed after its
    partitions moved, the frozen one is the zombie the fence must stop; killed, it would be
    one more kill."""
    return rng.choice([p for p in alive if p is not frozen] or alive)


@dataclass
class Restart:
    """One service stop/start running in the background, so kills go on meanwhile."""

    name: str
    stop: Callable[[], object]
    start: Callable[[], object]
    thread: threading.Thread | None = None
    error: BaseException | None = None
    stopped: bool = False  # stopped by us and not (yet) started again
    done: bool = False

    def begin(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"restart-{self.name}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.stopped = True
            self.stop()
            time.sleep(DOWN_S)
            self.start()
            self.stopped = False
        except BaseException as exc:  # handed to the main loop, which fails the run
            self.error = exc
        finally:
            self.done = True

    def ensure_started(self) -> None:
        """After the run, whatever happened: wait for the restart, start the service if it is
        still down because of us."""
        if self.thread is not None:
            self.thread.join(timeout=120)
        if self.stopped:
            self.start()
            self.stopped = False


def _progress(settings: Settings, campaign_id: int) -> Any:
    """Campaign progress, or None while PostgreSQL is down."""
    try:
        with psycopg.connect(settings.pg_dsn, autocommit=True, connect_timeout=2) as conn:
            return CampaignStore(conn).progress(campaign_id)
    except psycopg.OperationalError:
        return None


# Rows of the campaign in a call (their call started, no outcome recorded yet).
_IN_CALL = """
SELECT seq FROM campaign_recipients
 WHERE campaign_id = %(campaign_id)s AND status = 'sending' AND in_call_at IS NOT NULL
"""
# Rows the lease turned unknown after their call had started (expire_leases).
_LEASE_EXPIRED = """
SELECT seq FROM campaign_recipients
 WHERE campaign_id = %(campaign_id)s AND status = 'unknown' AND reason = 'lease_expired'
"""
PROMPT_READ_S = 2.0  # a read this soon after a fault needs no help from the lease's record

Rows = tuple[set[int], set[int]]  # (in a call, unknown by the lease)


def rows_in_call(settings: Settings, campaign_id: int) -> Rows | None:
    """The seqs of the campaign's rows in a call, and of those the lease has turned unknown;
    None while PostgreSQL is down."""
    try:
        with psycopg.connect(settings.pg_dsn, autocommit=True, connect_timeout=2) as conn:
            params = {"campaign_id": campaign_id}
            in_call = {int(r[0]) for r in conn.execute(_IN_CALL, params)}
            expired = {int(r[0]) for r in conn.execute(_LEASE_EXPIRED, params)}
            return in_call, expired
    except psycopg.OperationalError:
        return None


@dataclass
class InFlight:
    """The rows in a call right after each kill, the freeze and the PostgreSQL stop, read as
    soon as PostgreSQL answers: the only rows those faults can leave in doubt.

    A read made late (PostgreSQL was down) adds the rows the lease turned unknown since the
    previous read: the lease may have settled a stopped worker's rows before the read, and
    those rows were in a call when their worker stopped. Rows the lease settled between two
    prompt reads are never added: they must be in an earlier read."""

    read: Callable[[], Rows | None]
    seqs: set[int] = field(default_factory=set)
    waiting: list[tuple[float, bool]] = field(default_factory=list)  # (when, read late)
    expired_seen: set[int] = field(default_factory=set)  # unknown by the lease at the last read
    reads: int = 0
    late_reads: int = 0

    def after_fault(self, now: float, *, late: bool = False) -> None:
        self.waiting.append((now, late))
        self.catch_up(now)

    def catch_up(self, now: float) -> None:
        """Read for every fault not read yet, if PostgreSQL answers."""
        if not self.waiting:
            return
        late = any(forced or now - at > PROMPT_READ_S for at, forced in self.waiting)
        rows = self.read()
        if rows is None:
            return
        in_call, expired = rows
        self.seqs |= in_call
        if late:
            self.seqs |= expired - self.expired_seen
        self.expired_seen = expired
        self.reads += len(self.waiting)
        self.late_reads += len(self.waiting) if late else 0
        self.waiting.clear()


@dataclass
class Schedule:
    """The faults of one run and what they did."""

    options: ChaosOptions
    rng: random.Random
    pool: WorkerPool
    restarts: dict[str, Restart]
    log: Callable[[str], None]
    counters: dict[str, int] = field(
        default_factory=lambda: {
            "kills": 0,
            "broker_restarts": 0,
            "postgres_restarts": 0,
            "zombies": 0,
            "zombies_killed_frozen": 0,
            "worker_restarts": 0,
        }
    )
    worker_exits: list[dict[str, Any]] = field(default_factory=list)
    next_kill: float = 0.0
    zombie_at: float | None = None
    zombie: subprocess.Popen[bytes] | None = None
    zombie_thaw_at: float = 0.0
    pending_restarts: dict[str, float] = field(default_factory=dict)
    in_flight: InFlight | None = None

    def __post_init__(self) -> None:
        o = self.options
        self.next_kill = o.kill_every_s if o.kill_every_s > 0 else float("inf")
        self.zombie_at = o.zombie_at
        if o.restart_broker_at is not None:
            self.pending_restarts["broker"] = o.restart_broker_at
        if o.restart_postgres_at is not None:
            self.pending_restarts["postgres"] = o.restart_postgres_at

    def restarts_outstanding(self) -> bool:
        """A restart asked for is still to begin or to be back (a campaign can finish first)."""
        return bool(self.pending_restarts) or any(
            r.thread is not None for r in self.restarts.values()
        )

    def tick(self, t: float, busy: bool) -> None:
        """Apply every fault due at `t` seconds into the run."""
        pool, log = self.pool, self.log
        if busy and t >= self.next_kill and pool.alive():
            victim = pick_victim(self.rng, pool.alive(), self.zombie)
            if victim is self.zombie:
                self.counters["zombies_killed_frozen"] += 1
            pool.kill(victim, signal.SIGKILL)
            self._stopped_a_worker()
            self.counters["kills"] += 1
            log(f"chaos: t={t:.1f}s SIGKILL worker pid {victim.pid}")
            pool.spawn()
            self.next_kill = t + self.options.kill_every_s
        for name, at in list(self.pending_restarts.items()):
            if t >= at:
                del self.pending_restarts[name]
                log(f"chaos: t={t:.1f}s restarting {name} (down {DOWN_S:g}s)")
                if name == "postgres":
                    self._stopped_a_worker()  # the calls in flight now wait for PostgreSQL
                self.restarts[name].begin()
        for name, restart in self.restarts.items():
            if restart.error is not None:
                raise RuntimeError(f"{name} restart failed: {error_text(restart.error)}")
        self.count_restarts(t)
        if self.zombie_at is not None and t >= self.zombie_at and pool.alive():
            self.zombie_at = None
            candidate = self.rng.choice(pool.alive())
            if freeze(candidate):
                self._stopped_a_worker()
                self.zombie, self.zombie_thaw_at = candidate, t + ZOMBIE_FROZEN_S
                self.counters["zombies"] += 1
                log(f"chaos: t={t:.1f}s SIGSTOP worker pid {candidate.pid} (zombie)")
        if self.zombie is not None and t >= self.zombie_thaw_at:
            zombie, self.zombie = self.zombie, None
            if thaw(zombie):
                log(f"chaos: t={t:.1f}s SIGCONT worker pid {zombie.pid}")
            else:
                log(f"chaos: t={t:.1f}s zombie pid {zombie.pid} already ended; nothing to thaw")
        self._replace_dead_workers(t)
        if self.in_flight is not None:
            self.in_flight.catch_up(time.monotonic())

    def count_restarts(self, t: float) -> None:
        """Count the restarts that have finished, also after the campaign (a restart still
        running when the campaign ended is waited for, then counted here)."""
        for name, restart in self.restarts.items():
            if restart.done and restart.error is None and restart.thread is not None:
                restart.thread = None
                self.counters[f"{name}_restarts"] += 1
                self.log(f"chaos: t={t:.1f}s {name} back")
                if name == "postgres":
                    # Calls that entered just before the stop; the lease may turn them
                    # unknown as soon as reconcile runs again.
                    self._stopped_a_worker(late=True)

    def _stopped_a_worker(self, *, late: bool = False) -> None:
        if self.in_flight is not None:
            self.in_flight.after_fault(time.monotonic(), late=late)

    def _replace_dead_workers(self, t: float) -> None:
        for proc in list(self.pool.procs):
            if proc.poll() is not None and proc.returncode != -signal.SIGKILL:
                # A worker that died by itself (e.g. broker gone too long): restart it, like a
                # supervisor would, and keep what it said last.
                self.pool.procs.remove(proc)
                # Like a kill: the rows of a call it had in flight stay in doubt.
                self._stopped_a_worker()
                self.pool.spawn()
                self.counters["worker_restarts"] += 1
                self.worker_exits.append(
                    {
                        "t_s": round(t, 1),
                        "pid": proc.pid,
                        "returncode": proc.returncode,
                        "last_error": self.pool.last_error(proc),
                    }
                )
                self.log(
                    f"chaos: t={t:.1f}s worker {proc.pid} exited ({proc.returncode}); restarted"
                )


def run_chaos(
    base: Settings, options: ChaosOptions, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run the campaign under faults; always returns the result (`error` set when the run
    itself failed or was interrupted), with the broker and PostgreSQL running again and the
    campaign cancelled if it did not finish."""
    rng = random.Random(options.seed)
    # Workers get short timeouts so faults resolve within the run: a hung call times out after
    # ses_timeout_s, rows held by a killed worker become unknown after lease_s.
    settings = base.model_copy(
        update={"lease_s": options.lease_s, "ses_timeout_s": 3.0, "reconcile_interval_s": 2.0}
    )
    broker, postgres = KafkaBroker(settings), PostgresServer(settings)
    restarts = {
        "broker": Restart("broker", broker.stop, broker.start),
        "postgres": Restart("postgres", lambda: postgres.stop(mode="immediate"), postgres.start),
    }
    ses = SesStandinAdmin(settings.ses_endpoint_url or "")
    log_dir = settings.state_dir / "logs" / f"chaos-{int(time.time())}"
    loop: EventLoop | None = None
    if options.events_wait_s > 0 and settings.ses_endpoint_url:
        endpoint = settings.ses_endpoint_url
        settings = EventLoop.settings_for(settings)
        loop = EventLoop(settings, log_dir, SesEventsAdmin(endpoint))
    started = StartedCampaigns(settings)
    pool = WorkerPool(settings, log_dir, static=True)
    schedule = Schedule(options, rng, pool, restarts, log)
    result: dict[str, Any] = {"campaign_id": None}
    failure: BaseException | None = None
    faults_before: dict[str, Any] | None = None
    began = time.monotonic()
    cpu_before = _children_cpu_s()
    try:
        ensure_users(settings, options.users)
        SesSender(make_client(settings, timeout=10)).put_template(
            DEFAULT_TEMPLATE, DEFAULT_SUBJECT, DEFAULT_HTML, DEFAULT_TEXT
        )
        faults_before = dict(ses.faults())
        ses.set_faults(p_hang=options.ses_hang_rate)
        hung_before = ses.stats()["hung_recipients"]
        if loop is not None:
            loop.start()
        template = DEFAULT_TEMPLATE
        if options.promo_codes:
            SesSender(make_client(settings, timeout=10)).put_template(
                PROMO_TEMPLATE, PROMO_SUBJECT, PROMO_HTML, PROMO_TEXT
            )
            template = PROMO_TEMPLATE
        audience = f"({settings.audience_condition}) AND u.id <= {int(options.users)}"
        campaign_id = started.add(
            create_campaign(
                settings,
                name=f"chaos-{int(time.time())}",
                template=template,
                rate=options.rate,
                audience=audience,
            )
        )
        result["campaign_id"] = campaign_id
        if options.promo_codes:
            create_pool(settings, campaign_id, options.users)
        schedule.in_flight = InFlight(lambda: rows_in_call(settings, campaign_id))
        pool.start(options.workers)
        began = time.monotonic()
        start = start_campaign(settings, campaign_id)
        log(
            f"chaos: campaign {campaign_id}, {start.recipients:,} recipients, "
            f"{options.workers} workers"
        )
        _run_faults(
            settings, options, schedule, campaign_id, began, log, loop.check if loop else None
        )
        pool.stop()
        for restart in restarts.values():
            restart.ensure_started()
        schedule.count_restarts(time.monotonic() - began)
        result.update(_judge(settings, campaign_id, schedule, hung_before, options.promo_codes))
        if loop is not None:
            result.update(_judge_events(settings, campaign_id, loop, options, result, log))
        else:
            result["events"] = False
    except (Exception, KeyboardInterrupt) as exc:
        failure = exc
    finally:
        cleanup_errors = _clean_up(pool, restarts, ses, faults_before, loop)
    result.update(schedule.counters)
    result["worker_exits"] = schedule.worker_exits
    result["elapsed_s"] = round(time.monotonic() - began, 1)
    # Every flashsend process of the run (workers, webhook, feedback worker) has been reaped by
    # now. The broker, PostgreSQL and the stand-in are not counted: they restart during the run.
    cpu = _children_cpu_s() - cpu_before
    result["cpu_s_flashsend"] = round(cpu, 1)
    result["cpu_us_per_recipient_flashsend"] = (
        round(cpu / result["recipients"] * 1e6, 1) if result.get("recipients") else None
    )
    result = finish_run(result, started, failure, log)
    if cleanup_errors:
        result["cleanup_errors"] = cleanup_errors
    if "error" in result:
        result["invariants_ok"] = False
        result["invariants_failed"] = [*result.get("invariants_failed", []), "run_finished"]
    return result


def _children_cpu_s() -> float:
    """User + system CPU of this process's reaped children (and theirs)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _clean_up(
    pool: WorkerPool,
    restarts: dict[str, Restart],
    ses: SesStandinAdmin,
    faults_before: dict[str, Any] | None,
    loop: EventLoop | None = None,
) -> list[str]:
    """Stop the workers, start what the run stopped, restore the stand-in's faults; every
    step is tried whatever the others did."""
    errors: list[str] = []
    steps: list[tuple[str, Callable[[], object]]] = [("workers", pool.stop)]
    if loop is not None:
        steps.append(("event loop", loop.stop))
    steps += [(name, r.ensure_started) for name, r in restarts.items()]
    if faults_before is not None:
        p_hang = float(faults_before["p_hang"])
        steps.append(("stand-in faults", lambda: ses.set_faults(p_hang=p_hang)))
    for what, step in steps:
        try:
            step()
        except (Exception, KeyboardInterrupt) as exc:
            errors.append(f"{what}: {error_text(exc)}")
    return errors


# The campaign's unknown rows, by why: the lease (their worker stopped in a call) or the call
# itself (no answer: timeouts, hung calls, dropped connections, unreadable answers).
_UNKNOWN_ROWS = """
SELECT seq, reason = 'lease_expired' FROM campaign_recipients
 WHERE campaign_id = %s AND status = 'unknown'
"""


def _judge(
    settings: Settings,
    campaign_id: int,
    schedule: Schedule,
    hung_before: int,
    promo_codes: bool = False,
) -> dict[str, Any]:
    in_flight = schedule.in_flight
    if in_flight is not None:  # the workers' stop is the last fault: read what it left
        in_flight.after_fault(time.monotonic())
        if in_flight.waiting:
            raise RuntimeError("PostgreSQL does not answer after the run")
    # Last word: expire leases of rows held by killed workers, finish the campaign.
    with Reconciler(settings) as reconciler:
        reconciler.reconcile(campaign_id, lease_s=0.0)
    final = _progress(settings, campaign_id)
    if final is None:
        raise RuntimeError("PostgreSQL does not answer after the run")
    stats = standin_stats(settings, campaign_id)
    hung = int(stats.get("hung_recipients", 0)) - hung_before
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        unknown = [
            (int(seq), bool(lease)) for seq, lease in conn.execute(_UNKNOWN_ROWS, (campaign_id,))
        ]
    by_lease = {seq for seq, lease in unknown if lease}
    no_answer = len(unknown) - len(by_lease)
    seen = in_flight.seqs if in_flight is not None else set()
    counters = schedule.counters
    faults = (
        counters["kills"]
        + counters["zombies"]
        + counters["postgres_restarts"]
        + counters["worker_restarts"]
        + 1
    )
    lost = int(final["pending"] + final["sending"])
    result = {
        "recipients": final.total,
        "sent": final["sent"],
        "failed": final["failed"],
        "skipped": final["skipped"],
        "unknown": final["unknown"],
        "pending": final["pending"],
        "sending": final["sending"],
        "cancelled": final["cancelled"],
        "accepted_by_ses": stats.get("accepted"),
        "duplicates": stats.get("duplicates"),
        "hung_recipients": hung,
        "in_flight_at_kills": len(seen),
        "in_flight_reads_late": in_flight.late_reads if in_flight is not None else None,
        "in_flight_max": faults * settings.partitions * MAX_ENTRIES,
        "unknown_lease_expired": len(by_lease),
        "unknown_no_answer": no_answer,
        "unknown_outside_in_flight": len(by_lease - seen),
        "unknown_bound": len(seen) + no_answer,
        "unknown_per_kill": round(final["unknown"] / counters["kills"], 1)
        if counters["kills"]
        else None,
        "lost": lost,
    }
    result["invariants"] = {
        "no_duplicates": result["duplicates"] == 0,
        "none_lost": lost == 0,
        "unknown_only_from_in_flight": result["unknown_outside_in_flight"] == 0,
        "in_flight_within_max": len(seen) <= result["in_flight_max"],
    }
    if promo_codes:
        # Read from our rows and from the stand-in: each code bound to one recipient and
        # mailed to one address, one code per recipient, nothing sent without a code.
        result.update(promo_verdict(settings, campaign_id, stats))
        result["invariants"]["promo_codes_unique"] = result["promo_codes_unique"]
    return _with_verdict(result)


def _with_verdict(result: dict[str, Any]) -> dict[str, Any]:
    """`invariants_ok`, and `invariants_failed`: the names of the checks that do not hold."""
    failed = [name for name, ok in result["invariants"].items() if not ok]
    result["invariants_failed"] = failed
    result["invariants_ok"] = not failed
    return result


def _judge_events(
    settings: Settings,
    campaign_id: int,
    loop: EventLoop,
    options: ChaosOptions,
    result: dict[str, Any],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """The rows in doubt once SES's events are in; `sent`, `failed` and `unknown` become the
    counts after them (`unknown_at_end`: before)."""
    verdict = judge_in_doubt(
        settings, campaign_id, loop.events, options.events_wait_s, log, loop.delivered
    )
    final = _progress(settings, campaign_id)
    if final is None:
        raise RuntimeError("PostgreSQL does not answer after the run")
    out: dict[str, Any] = {
        "events": True,
        "unknown_at_end": result["unknown"],
        **verdict,
        "sent": final["sent"],
        "failed": final["failed"],
        "unknown": final["unknown"],
        "event_loop_restarts": dict(loop.restarts),
        "events_emission": loop.emission(),
    }
    out["invariants"] = {
        **result["invariants"],
        "never_accepted_within_bound": verdict.get("unknown_never_accepted", 0)
        <= result["unknown_bound"],
        "accepted_all_settled": verdict.get("unknown_accepted_unresolved") == 0,
        "settled_only_if_accepted": verdict.get("resolved_not_accepted") == 0,
        "accepted_by_ses_equals_sent": result["accepted_by_ses"] == final["sent"],
    }
    return _with_verdict(out)


def _run_faults(
    settings: Settings,
    options: ChaosOptions,
    schedule: Schedule,
    campaign_id: int,
    began: float,
    log: Callable[[str], None],
    on_tick: Callable[[], None] | None = None,
) -> None:
    while True:
        t = time.monotonic() - began
        if on_tick is not None:
            on_tick()
        progress = _progress(settings, campaign_id)
        if progress is not None and progress.finished and not schedule.restarts_outstanding():
            return
        if t > options.timeout_s:
            log(f"chaos: timeout after {t:.0f}s")
            return
        schedule.tick(t, busy=progress is None or progress["pending"] > 0)
        time.sleep(0.5)
