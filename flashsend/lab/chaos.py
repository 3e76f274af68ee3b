"""`flashsend chaos`: a campaign under faults, judged by the provider's own record.

While the campaign runs: SIGKILL a worker every `kill_every_s` (a supervisor starts a
replacement, as systemd would), restart the workers one at a time with SIGTERM (a rolling
restart: each drains, exits, and a replacement starts), stop and restart Kafka (every node,
same data dirs) and PostgreSQL (immediate shutdown = crash recovery), SIGKILL the Kafka node
leading the most partitions of the campaign topic and start it again later, optionally freeze
a worker past the rebalance (zombie) and let the SES stand-in accept calls without answering.
Then wait for the campaign to finish (reconcile turns expired leases into `unknown`) and check
the invariants:

- duplicates == 0 (counted by the stand-in, per destination);
- with a promo pool (`promo_codes`), promo_codes_unique: no code bound to two recipients nor
  mailed to two addresses, no recipient holding or receiving two, nothing sent without one;
- lost == 0 (no recipient left pending/sending);
- every row that ended `unknown` when its lease expired (reason `lease_expired`: its worker
  died or froze in a call) was in a call right after one of the kills, the freeze or a
  worker's own exit (entering a call renews the lease, so a live worker's call is never
  reaped). Right after each, the run reads the campaign's rows in a call (`sending` with
  `in_call_at`): the stopped worker's are among them, and they stay so until the lease turns
  them `unknown`. After a kill the read waits until PostgreSQL has closed the dead worker's
  sessions: a COMMIT it sent just before the signal (rows entering a call) still runs there.
  A kill while PostgreSQL is down is read once it answers again, then counting the rows
  the lease has turned `unknown` meanwhile too. `in_flight_at_kills` is the union of those
  reads, at most MAX_ENTRIES per lane with a call in flight; `unknown_bound` adds the
  rows of calls with no answer (their own reason: timeouts, hung calls, dropped connections).

`invariants` names each check; `invariants_failed` lists those that do not hold.

With the event loop (`events_wait_s` > 0: a webhook process and a feedback worker), SES's
events settle the rows in doubt as in production; after the run every row that is or was
unknown is looked up at the stand-in, the run waits (bounded) for the accepted ones to be
settled, and more invariants hold: no accepted row is still unknown, no row was settled
without the stand-in having accepted it, and accepted_by_ses == sent
(flashsend/chaos_events.py).

A drained worker is not read like a kill: its drain records the outcome of its calls in
flight and releases what it held, so a rolling restart leaves no row in doubt, and a row it
did leave to the lease counts against `unknown_only_from_in_flight`.

The faults combine freely: restarts run in the background while kills go on, the kill
schedule picks the frozen worker only when no other is alive, a restart may fail. Whatever
happens, the run restarts what it stopped, cancels its campaign if unfinished and returns a
result (with `error` when the run itself failed).
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import psycopg

from flashsend.errors import UsageError
from flashsend.lab.chaos_events import EventLoop, judge_in_doubt
from flashsend.lab.demo import SMS_BODY, create_pool, ensure_users, promo_verdict, standin_stats
from flashsend.lab.push_devices import device_verdict, seed_devices
from flashsend.lab.run import StartedCampaigns, error_text, finish_run
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from infra.kafka import KafkaBroker, KafkaCluster, broker_ids, busiest_leader, partition_leaders
from infra.postgres import PostgresServer
from infra.process import pid_alive
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
from sinks.users import fill_phones
from streams.sender import MAX_ENTRIES

DOWN_S = 3.0  # how long Kafka or PostgreSQL stays stopped
# How long a SIGKILLed Kafka node stays down (--broker-down-s): past the controller's broker
# session timeout (Kafka's default 9 s), after which it fences the node and the partitions
# it led get new leaders; a shorter outage is one the cluster may only wait through.
BROKER_DOWN_S = 15.0
KILL_EVERY_S = 5.0  # --kill-every unless a rolling restart is asked for
ZOMBIE_FROZEN_S = 15.0  # past session.timeout: the frozen worker's partitions are reassigned
# Past the worker's own shutdown grace (its watchdog exits it), a drain is over: SIGKILL.
DRAIN_MARGIN_S = 10.0


@dataclass(frozen=True)
class ChaosOptions:
    users: int = 200_000
    workers: int = 3
    rate: float = 0.0
    kill_every_s: float = KILL_EVERY_S
    restart_broker_at: float | None = None
    kill_broker_at: float | None = None
    broker_down_s: float = BROKER_DOWN_S
    rolling_restart_every_s: float = 0.0  # 0: no rolling restart
    restart_postgres_at: float | None = None
    zombie_at: float | None = None
    ses_hang_rate: float = 0.0
    lease_s: float = 20.0
    timeout_s: float = 900.0
    seed: int = 7
    events_wait_s: float = 30.0  # 0: no event loop (no webhook, no feedback worker)
    promo_codes: bool = False  # a promo pool: invariant promo_codes_unique
    channel: str = "email"  # "sms": texts to users' phones (no event loop: no SMS events)


def default_kill_every(kill_every_s: float | None, rolling_restart_every_s: float) -> float:
    """--kill-every when not given: no SIGKILL during a rolling restart (it is the fault under
    test), KILL_EVERY_S otherwise."""
    if kill_every_s is not None:
        return kill_every_s
    return 0.0 if rolling_restart_every_s > 0 else KILL_EVERY_S


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


def pick_victim(
    rng: random.Random, alive: list[T], frozen: T | None, draining: T | None = None
) -> T:
    """The worker to kill: any but the frozen one and the draining one while another is alive.
    Thawed after its partitions moved, the frozen one is the zombie the fence must stop; the
    draining one is a rolling restart under way; killed, either would be one more kill."""
    return rng.choice([p for p in alive if p is not frozen and p is not draining] or alive)


@dataclass
class RollingRestarts(Generic[T]):
    """When the next rolling restart is due and which worker it stops. One worker at a time, as
    a scheduler rolls a deployment with one unavailable: the next SIGTERM comes `every_s`
    after the previous one, never before the previous worker has exited (its replacement
    starts then), and never while a live worker is not ready (its /readyz, asked by the run).
    Each in turn: the worker running longest, since replacements join the end of the live
    list. Pure: the run passes the time."""

    every_s: float
    next_at: float = 0.0
    draining: T | None = None
    since: float = 0.0

    def __post_init__(self) -> None:
        self.next_at = self.every_s

    def due(self, t: float) -> bool:
        """Time for the next SIGTERM (the run then also asks every live worker's readiness)."""
        return self.every_s > 0 and self.draining is None and t >= self.next_at

    def next_worker(self, alive: Sequence[T], frozen: T | None = None) -> T | None:
        """The live worker (in start order) to restart next: the oldest but the frozen one."""
        return next((w for w in alive if w is not frozen), None)

    def began(self, worker: T, t: float) -> float:
        """`worker` got SIGTERM at `t`; seconds it came after its due time (a drain, or a
        worker not ready, held it back)."""
        late = t - self.next_at
        self.draining, self.since = worker, t
        self.next_at = t + self.every_s
        return late

    def ended(self, t: float) -> float:
        """The draining worker is gone; seconds since its SIGTERM."""
        self.draining = None
        return t - self.since


@dataclass
class Restart:
    """One service stop/start running in the background, so kills go on meanwhile."""

    name: str
    stop: Callable[[], object]
    start: Callable[[], object]
    counter: str = ""  # the result's count of these restarts; default `<name>_restarts`
    down_s: float = DOWN_S
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
            time.sleep(self.down_s)
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


@dataclass
class BrokerKill:
    """SIGKILL the Kafka node leading the most partitions of the campaign topic (read from the
    cluster's metadata at that moment), and start it again (a `Restart`'s stop and start).
    `record` keeps what happened: the node, the partitions it led, how many of those had
    another leader just before it came back, how many recipients SES accepted for the
    campaign while it was down, and how long it was out."""

    settings: Settings
    log: Callable[[str], None]
    accepted: Callable[[], int] = lambda: 0  # recipients SES accepted for the campaign so far
    node: KafkaBroker | None = None
    record: dict[str, Any] = field(default_factory=dict)
    _led: set[int] = field(default_factory=set)
    _killed_at: float = 0.0
    _accepted_at_kill: int = 0

    def kill(self) -> None:
        s = self.settings
        leaders = partition_leaders(s.kafka_bootstrap, s.topic_recipients)
        node_id = busiest_leader(leaders)
        node = KafkaBroker(s, node_id - 1)  # node ids are 1-based
        pid = node.process.pid()
        if pid is None:
            raise RuntimeError(
                f"kafka node {node_id} leads the most partitions of {s.topic_recipients} but "
                f"has no running process under {s.state_dir / 'run'}: chaos kills only the "
                "local stack's brokers"
            )
        self._accepted_at_kill = self.accepted()
        os.kill(pid, signal.SIGKILL)
        self._killed_at = time.monotonic()
        self.node = node
        deadline = self._killed_at + 10
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        self._led = {p for p, leader in leaders.items() if leader == node_id}
        self.record = {
            "node": node_id,
            "partitions_led": len(self._led),
            "partitions": len(leaders),
        }
        self.log(
            f"chaos: SIGKILL kafka node {node_id} "
            f"(led {len(self._led)} of {len(leaders)} partitions)"
        )

    def start(self) -> None:
        node = self.node
        if node is None:  # the kill failed: nothing to start
            return
        if "accepted_while_down" not in self.record:
            self.record["accepted_while_down"] = self.accepted() - self._accepted_at_kill
            self.record["leaders_moved"] = self._moved(node.node + 1)
        node.start(timeout=180)
        self.record["down_s"] = round(time.monotonic() - self._killed_at, 1)
        self.node = None

    def _moved(self, node_id: int) -> int | None:
        """How many partitions the node led have another leader now (None: no metadata, as on
        one broker)."""
        s = self.settings
        if s.kafka_brokers == 1:
            return None  # no node to ask (it would time out)
        try:
            leaders = partition_leaders(s.kafka_bootstrap, s.topic_recipients)
        except Exception:
            return None
        return sum(1 for p in self._led if leaders.get(p, -1) not in (-1, node_id))


def check_kafka_nodes(settings: Settings) -> None:
    """Chaos starts and stops the local Kafka nodes by the settings' layout (node i on the
    base port + 10 i; each node's config is written again at its start): refuse a stack whose
    broker count the settings do not match, rather than start a node with a wrong quorum."""
    found = broker_ids(settings.kafka_bootstrap)
    if len(found) != settings.kafka_brokers:
        raise UsageError(
            f"the stack's Kafka has {len(found)} broker(s) but FLASHSEND_KAFKA_BROKERS="
            f"{settings.kafka_brokers}: run chaos with the setting the stack was started with "
            f"(FLASHSEND_KAFKA_BROKERS={len(found)} flashsend chaos …)"
        )


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
            "broker_kills": 0,
            "rolling_restarts": 0,
            "drain_timeouts": 0,
        }
    )
    worker_exits: list[dict[str, Any]] = field(default_factory=list)
    drains: list[dict[str, Any]] = field(default_factory=list)  # one per rolling restart
    late_s: float = 0.0  # how late the SIGTERM under way came (RollingRestarts.began)
    rolling: RollingRestarts[subprocess.Popen[bytes]] | None = None
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
        if o.kill_broker_at is not None:
            self.pending_restarts["broker_kill"] = o.kill_broker_at
        if o.rolling_restart_every_s > 0:
            self.rolling = RollingRestarts(o.rolling_restart_every_s)

    def restarts_outstanding(self) -> bool:
        """A restart asked for is still to begin or to be back (a campaign can finish first),
        or a drained worker has not exited yet."""
        return (
            bool(self.pending_restarts)
            or any(r.thread is not None for r in self.restarts.values())
            or (self.rolling is not None and self.rolling.draining is not None)
        )

    def tick(self, t: float, busy: bool) -> None:
        """Apply every fault due at `t` seconds into the run."""
        pool, log = self.pool, self.log
        draining = self.rolling.draining if self.rolling is not None else None
        if busy and t >= self.next_kill and pool.alive():
            victim = pick_victim(self.rng, pool.alive(), self.zombie, draining)
            if victim is self.zombie:
                self.counters["zombies_killed_frozen"] += 1
            if self.rolling is not None and victim is draining:
                self.rolling.ended(t)  # killed mid-drain: a kill, not a rolling restart
            pool.kill(victim, signal.SIGKILL)
            pool.sessions_closed(victim)
            self._stopped_a_worker()
            self.counters["kills"] += 1
            log(f"chaos: t={t:.1f}s SIGKILL worker pid {victim.pid}")
            pool.spawn()
            self.next_kill = t + self.options.kill_every_s
        for name, at in list(self.pending_restarts.items()):
            if t >= at:
                del self.pending_restarts[name]
                down = self.restarts[name].down_s
                log(f"chaos: t={t:.1f}s restarting {name} (down {down:g}s)")
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
        self._roll(t, busy)
        self._replace_dead_workers(t)
        if self.in_flight is not None:
            self.in_flight.catch_up(time.monotonic())

    def count_restarts(self, t: float) -> None:
        """Count the restarts that have finished, also after the campaign (a restart still
        running when the campaign ended is waited for, then counted here)."""
        for name, restart in self.restarts.items():
            if restart.done and restart.error is None and restart.thread is not None:
                restart.thread = None
                self.counters[restart.counter or f"{name}_restarts"] += 1
                self.log(f"chaos: t={t:.1f}s {name} back")
                if name == "postgres":
                    # Calls that entered just before the stop; the lease may turn them
                    # unknown as soon as reconcile runs again.
                    self._stopped_a_worker(late=True)

    def _stopped_a_worker(self, *, late: bool = False) -> None:
        if self.in_flight is not None:
            self.in_flight.after_fault(time.monotonic(), late=late)

    def _roll(self, t: float, busy: bool) -> None:
        """The rolling restart: a drained worker that exited is replaced; then, when due, the
        next worker in turn gets SIGTERM."""
        rolling = self.rolling
        if rolling is None:
            return
        worker = rolling.draining
        if worker is not None:
            if worker.poll() is None:
                grace = self.pool.settings.worker_shutdown_grace_s
                if t - rolling.since < grace + DRAIN_MARGIN_S:
                    return
                # Its watchdog did not end it: a kill, and its call's rows stay in doubt.
                self.pool.kill(worker, signal.SIGKILL)
                self.pool.sessions_closed(worker)
                self._stopped_a_worker()
                self.counters["drain_timeouts"] += 1
            took = rolling.ended(t)
            self.pool.procs.remove(worker)
            replacement = self.pool.spawn()
            self.counters["rolling_restarts"] += 1
            self.drains.append(
                {
                    "t_s": round(t, 1),
                    "pid": worker.pid,
                    "returncode": worker.returncode,
                    "drain_s": round(took, 1),
                    "late_s": round(self.late_s, 1),
                }
            )
            self.log(
                f"chaos: t={t:.1f}s worker pid {worker.pid} exited {took:.1f}s after SIGTERM "
                f"({worker.returncode}); started pid {replacement.pid}"
            )
        if not (busy and rolling.due(t)):
            return
        alive = self.pool.alive()
        if not all(self.pool.ready(w) for w in alive if w is not self.zombie):
            return
        victim = rolling.next_worker(alive, self.zombie)
        if victim is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim.pid, signal.SIGTERM)
        self.late_s = rolling.began(victim, t)
        self.log(f"chaos: t={t:.1f}s SIGTERM worker pid {victim.pid} (rolling restart)")

    def _replace_dead_workers(self, t: float) -> None:
        draining = self.rolling.draining if self.rolling is not None else None
        for proc in list(self.pool.procs):
            if proc is draining:
                continue
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
        update={
            "lease_s": options.lease_s,
            "ses_timeout_s": 3.0,
            "sms_timeout_s": 3.0,
            "reconcile_interval_s": 2.0,
        }
    )
    kafka, postgres = KafkaCluster(settings), PostgresServer(settings)
    broker_kill = BrokerKill(settings, log)
    restarts = {
        "broker": Restart("broker", kafka.stop, kafka.start),
        "postgres": Restart("postgres", lambda: postgres.stop(mode="immediate"), postgres.start),
        "broker_kill": Restart(
            "broker_kill",
            broker_kill.kill,
            broker_kill.start,
            counter="broker_kills",
            down_s=options.broker_down_s,
        ),
    }
    ses = SesStandinAdmin(settings.ses_endpoint_url or "")
    log_dir = settings.state_dir / "logs" / f"chaos-{int(time.time())}"
    loop: EventLoop | None = None
    if options.events_wait_s > 0 and settings.ses_endpoint_url:
        endpoint = settings.ses_endpoint_url
        settings = EventLoop.settings_for(settings)
        loop = EventLoop(settings, log_dir, SesEventsAdmin(endpoint))
    started = StartedCampaigns(settings)
    pool = WorkerPool(settings, log_dir, static=True, probes=options.rolling_restart_every_s > 0)
    schedule = Schedule(options, rng, pool, restarts, log)
    result: dict[str, Any] = {"campaign_id": None}
    failure: BaseException | None = None
    faults_before: dict[str, Any] | None = None
    began = time.monotonic()
    cpu_before = _children_cpu_s()
    try:
        if options.restart_broker_at is not None or options.kill_broker_at is not None:
            check_kafka_nodes(settings)
        ensure_users(settings, options.users)
        sms = options.channel == "sms"
        if sms:
            if options.promo_codes or loop is not None:
                raise UsageError("--channel sms runs without --promo-codes and the event loop")
            fill_phones(settings.pg_dsn, options.users)
        push = options.channel == "push"
        if push:
            if options.promo_codes or loop is not None:
                raise UsageError("--channel push runs without --promo-codes and the event loop")
            result.update(seed_devices(settings, options.users))
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
                # Quiet hours off: the run must send whatever the hour (its users' zone is the
                # default one); the demo's --local-window shows them.
                settings.model_copy(update={"sms_send_hours": "", "push_send_hours": ""}),
                name=f"chaos-{int(time.time())}",
                template=SMS_BODY if sms or push else template,
                rate=options.rate,
                audience=audience,
                channel=options.channel,
            )
        )
        result["campaign_id"] = campaign_id
        if options.promo_codes:
            create_pool(settings, campaign_id, options.users)
        schedule.in_flight = InFlight(lambda: rows_in_call(settings, campaign_id))
        broker_kill.accepted = lambda: int(
            standin_stats(settings, campaign_id, options.channel).get("accepted") or 0
        )
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
        result.update(
            _judge(
                settings, campaign_id, schedule, hung_before, options.promo_codes, options.channel
            )
        )
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
    if options.kill_broker_at is not None:
        result["broker_killed"] = broker_kill.record or None
    if options.rolling_restart_every_s > 0:
        result["drains"] = schedule.drains
        result["drain_s_max"] = max((d["drain_s"] for d in schedule.drains), default=None)
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
    channel: str = "email",
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
    stats = standin_stats(settings, campaign_id, channel)
    hung = int(stats.get("hung_recipients", 0)) - hung_before
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        unknown = [
            (int(seq), bool(lease)) for seq, lease in conn.execute(_UNKNOWN_ROWS, (campaign_id,))
        ]
    by_lease = {seq for seq, lease in unknown if lease}
    no_answer = len(unknown) - len(by_lease)
    seen = in_flight.seqs if in_flight is not None else set()
    outside = by_lease - seen
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
        "unknown_outside_in_flight": len(outside),
        "unknown_outside_seqs": sorted(outside)[:20],  # the first few, to look them up
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
    if channel == "push":
        # Duplicates are counted per device endpoint at the stand-in (the ledger's
        # `duplicates`); a row skipped must say why.
        result.update(device_verdict(settings, campaign_id, stats))
        result["invariants"]["skipped_with_reason"] = result["rows_skipped_without_reason"] == 0
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
