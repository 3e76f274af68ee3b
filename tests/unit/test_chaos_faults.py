"""Chaos faults that meet each other: the frozen worker (zombie) may already be dead when its
thaw is due, because the kill schedule picked it meanwhile. Real processes, no stack needed."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
from pathlib import Path

from flashsend.lab.chaos import PROMPT_READ_S, InFlight, freeze, pick_victim, thaw
from flashsend.lab.workers import WorkerPool
from flashsend.settings import load_settings


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_thawing_a_zombie_the_kill_schedule_already_killed_does_not_crash() -> None:
    zombie = _sleeper()
    assert freeze(zombie)
    zombie.send_signal(signal.SIGKILL)  # the kill schedule picks the frozen worker
    zombie.wait(timeout=10)  # … and reaps it: its pid is gone (ProcessLookupError)
    assert thaw(zombie) is False
    assert freeze(zombie) is False


def test_thaw_continues_a_frozen_process() -> None:
    proc = _sleeper()
    try:
        assert freeze(proc)
        assert thaw(proc)
        with open(f"/proc/{proc.pid}/stat") as f:
            assert f.read().split(") ", 1)[1][:1] != "T"  # not stopped
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_worker_log_says_why_it_exited(tmp_path: Path) -> None:
    pool = WorkerPool(load_settings(state_dir=tmp_path), tmp_path)
    proc = _sleeper()
    log_file = tmp_path / "worker-0.log"
    log_file.write_text(
        "[2026-12-03 15:30:21,928] [1] [ERROR] [^---Recovery]: Crashed reason=StoreUnavailable\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 1, in <module>\n'
        "sinks.offsets.StoreUnavailable: server closed the connection unexpectedly\n"
        "[2026-12-03 15:30:22,961] [1] [CRITICAL] We experienced a crash!\n"
    )
    pool.log_files[proc.pid] = log_file
    try:
        assert pool.last_error(proc) == (
            "sinks.offsets.StoreUnavailable: server closed the connection unexpectedly"
        )
    finally:
        proc.kill()
        proc.wait(timeout=10)


class _Reads:
    """What PostgreSQL would answer: (rows in a call, rows unknown by the lease); None: down."""

    def __init__(self, *answers: tuple[set[int], set[int]] | None) -> None:
        self.answers = list(answers)

    def __call__(self) -> tuple[set[int], set[int]] | None:
        return self.answers.pop(0)


def test_the_rows_in_a_call_are_read_right_after_each_kill() -> None:
    in_flight = InFlight(_Reads(({1, 2}, set()), ({2, 3}, {1})))
    in_flight.after_fault(10.0)
    in_flight.after_fault(15.0)  # row 1 turned unknown by its lease: it was read at 10.0
    assert in_flight.seqs == {1, 2, 3}
    assert (in_flight.reads, in_flight.late_reads) == (2, 0)


def test_a_prompt_read_never_takes_the_rows_the_lease_settled_meanwhile() -> None:
    """Row 9 turned unknown between two prompt reads without ever being read in a call: no
    fault explains it, so the bound must not cover it."""
    in_flight = InFlight(_Reads(({1}, set()), ({2}, {9})))
    in_flight.after_fault(10.0)
    in_flight.after_fault(15.0)
    assert 9 not in in_flight.seqs


def test_a_kill_while_postgres_is_down_is_read_late_with_the_rows_the_lease_settled() -> None:
    # Read before the outage: row 4 is unknown by its lease already (an earlier kill's).
    in_flight = InFlight(_Reads(({1}, {4}), None, None, ({8}, {4, 7})))
    in_flight.after_fault(5.0)
    in_flight.after_fault(10.0)  # PostgreSQL down: nothing read yet
    in_flight.catch_up(11.0)
    assert in_flight.waiting and in_flight.seqs == {1}
    in_flight.catch_up(14.0)  # back, more than PROMPT_READ_S after the kill
    # Row 7 was settled by the lease while nobody could read; row 4 was not (read before).
    assert in_flight.seqs == {1, 7, 8}
    assert (in_flight.reads, in_flight.late_reads) == (2, 1)
    in_flight.catch_up(20.0)  # nothing waiting: no read (the reads would run out)


def test_a_read_asked_late_is_late_even_at_once() -> None:
    in_flight = InFlight(_Reads((set(), set()), (set(), {3})))
    in_flight.after_fault(10.0)
    in_flight.after_fault(10.5, late=True)  # PostgreSQL back: its stop's rows may be settled
    assert in_flight.seqs == {3}
    assert PROMPT_READ_S > 0.5


def test_the_kill_schedule_spares_the_frozen_worker_while_another_is_alive() -> None:
    rng = random.Random(7)
    assert {pick_victim(rng, ["a", "zombie", "c"], "zombie") for _ in range(200)} == {"a", "c"}
    assert pick_victim(rng, ["zombie"], "zombie") == "zombie"
    assert {pick_victim(rng, ["a", "b"], None) for _ in range(200)} == {"a", "b"}
