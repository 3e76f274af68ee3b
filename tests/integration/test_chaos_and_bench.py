"""Short versions of the long-running commands (`flashsend chaos`, `flashsend bench`,
`flashsend demo`): the same code paths on small numbers, so the commands cannot rot. Figures
come from the commands; these tests check that each is computed, not what it is (the limiter
and the pause have their own tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

from flashsend.lab.bench import BenchOptions, run_bench
from flashsend.lab.chaos import ChaosOptions, run_chaos
from flashsend.lab.feedback_run import WebhookProcess, with_feedback
from flashsend.settings import Settings, settings_env
from infra.process import port_open
from infra.ses_standin.events_admin import SesEventsAdmin
from tests.integration.campaign_helpers import admin

LIVE = ("draft", "snapshotting", "sending", "paused")


def test_chaos_kills_restarts_zombie_and_hangs_keep_the_invariants(settings: Settings) -> None:
    result = run_chaos(
        settings,
        ChaosOptions(
            # ~6,900 recipients at 300/s: sending outlasts every scheduled fault (a faster
            # campaign could finish before the PostgreSQL restart on a loaded machine).
            users=8_000,
            workers=3,
            rate=300,
            kill_every_s=6,
            restart_broker_at=8,
            restart_postgres_at=16,
            zombie_at=4,
            # Enough that some call hangs (its rows end unknown, accepted by SES) in every run.
            ses_hang_rate=0.03,
            lease_s=15,
            timeout_s=240,
        ),
        log=print,
    )
    # The whole result, untruncated, in the failure report's captured output.
    print(json.dumps(result, indent=1, sort_keys=True))
    assert "error" not in result, result["error"]
    assert result["kills"] >= 1
    assert result["broker_restarts"] == 1 and result["postgres_restarts"] == 1
    assert result["zombies"] == 1
    assert result["duplicates"] == 0, result
    assert result["lost"] == 0, result
    assert result["invariants_failed"] == [], json.dumps(result, default=str)
    assert result["invariants_ok"]
    assert isinstance(result["worker_exits"], list)
    # SES's events settled every row in doubt the stand-in accepted (hung calls are accepted).
    assert result["events"] is True
    assert result["unknown_accepted_by_ses"] + result["resolved_before_answer"] > 0, result
    assert result["unknown_accepted_unresolved"] == 0, result
    assert result["resolved_not_accepted"] == 0, result
    assert result["unknown"] == result["unknown_never_accepted"], result
    assert result["accepted_by_ses"] == result["sent"], result


def test_a_rolling_restart_drains_each_worker_and_leaves_nothing_in_doubt(
    settings: Settings,
) -> None:
    """Every few seconds a worker gets SIGTERM, drains, exits and is replaced, while every
    lane has a call out (the stand-in answers each after 500 ms): nothing ends unknown, sent
    twice or lost. A drain that does not wait for its calls (DRAIN_S = 0) leaves their rows
    to the lease, and they end unknown."""
    ses = admin(settings)
    ses.set_faults(latency_ms=500)
    try:
        result = run_chaos(
            settings,
            ChaosOptions(
                # ~8,600 recipients, unlimited: ~25 s of sending and each restart's rebalances
                # (the next restart waits until every worker is ready again).
                users=10_000,
                workers=2,
                rate=0,
                kill_every_s=0,
                rolling_restart_every_s=3,
                timeout_s=150,
                events_wait_s=0,
            ),
            log=print,
        )
    finally:
        ses.set_faults(latency_ms=0)
    print(json.dumps(result, indent=1, sort_keys=True))
    assert "error" not in result, result["error"]
    assert result["rolling_restarts"] >= 2, result["drains"]
    assert result["kills"] == 0 and result["drain_timeouts"] == 0, result
    assert result["unknown"] == 0, result
    assert result["duplicates"] == 0 and result["lost"] == 0, result
    assert result["invariants_ok"], result["invariants_failed"]
    # Within the worker's grace: a shutdown that hangs after the drain (Faust leaving its
    # group) ends by the worker's own watchdog at the grace, exit code 0, rows already settled.
    grace = settings.worker_shutdown_grace_s
    assert result["drain_s_max"] <= grace + 1.5, result["drains"]


def test_bench_short_run_produces_every_figure(settings: Settings, tmp_path: Path) -> None:
    rates = (37.0, 777.0, 3120.0)
    # The event loop as `flashsend up` runs it: the stand-in posts Delivery events to a real
    # webhook; the bench's own feedback worker applies them and times the lag.
    settings = with_feedback(settings)
    events = SesEventsAdmin(settings.ses_endpoint_url or "")
    webhook = WebhookProcess.start(settings, tmp_path / "logs")
    sub_id = str(
        events.subscribe(
            webhook.sns_url,
            settings.sns_topic_arns[0],
            configuration_sets=[settings.marketing_configuration_set],
            event_types=["Delivery"],
        )["id"]
    )
    try:
        events.wait_confirmed(sub_id)
        result = run_bench(
            settings,
            BenchOptions(
                users=6_000,
                workers=2,
                naive_users=300,
                sweep_rates=rates,
                sweep_seconds=3,
                pauses=2,
                pause_rate=1000,
                out_dir=tmp_path,
            ),
            log=lambda _: None,
        )
    finally:
        events.unsubscribe(sub_id)
        webhook.stop()
    assert "error" not in result, result
    for key in (
        "snapshot_s",
        "seed_snapshot_s",
        "produce_s",
        "send_rate_per_s",
        "end_to_end_s",
        "end_to_end_rate_per_s",
        "cpu_us_per_recipient",
        "cpu_us_per_recipient_product",
        "naive_rate_per_s",
        "speedup_vs_naive",
    ):
        assert isinstance(result[key], int | float) and result[key] > 0, (key, result[key])
    assert result["duplicates"] == 0
    assert result["pending"] == 0
    assert result["speedup_vs_naive"] > 1

    sweep = result["limiter_sweep"]
    assert [row["rate"] for row in sweep] == list(rates)
    for row in sweep:
        assert row["max_1s_window"] > 0 and row["sent"] > 0, row
        assert row["ratio"] == round(row["max_1s_window"] / row["rate"], 3), row
        assert row["avg_ratio"] is not None and row["avg_ratio"] > 0, row
        assert row["duplicates"] == 0, row
    assert result["limiter_worst_ratio"] == max(row["ratio"] for row in sweep)

    pause = result["pause_latency_ms"]
    assert pause["clock_problem"] is False, pause
    assert [run["rate"] for run in pause["at_rate"]] == [1000.0, 0.0]
    for run in pause["at_rate"]:
        assert run["samples"] == 2 and len(run["all"]) == 2, run
        assert run["from_request_ms"]["samples"] == 2, run
    assert pause["samples"] == 4 and pause["median"] is not None

    status = result["status_query_ms"]
    assert status["samples"] >= 1 and 0 < status["median"] <= status["max"], status
    gate = result["feedback_gate"]  # read beside the status query, while the campaign sends
    assert 0 <= gate["closed_s"] <= gate["sampled_s"] and gate["closed_share"] is not None, gate

    # The cost model's per-statement rows: the claim is among the statements that cost most.
    statements = result["pg_statements"]
    assert statements and all(row["calls"] > 0 for row in statements), statements
    assert any("WITH cand AS MATERIALIZED" in row["statement"] for row in statements), statements

    # Every sampled Delivery of the main campaign was applied, its lag measured per event.
    assert result["events_lag_sample"] >= 20, result
    assert result["events_not_applied"] == 0, result
    assert result["events_dropped_at_standin"] == 0, result
    assert 0 <= result["events_lag_p50_s"] <= result["events_lag_p99_s"], result
    assert result["events_lag_p99_s"] <= result["events_lag_max_s"], result
    assert result["events_backlog_at_start"] >= 0, result

    by_component = result["cpu_us_per_recipient_by_component"]
    assert {"workers", "postgres", "kafka", "ses_standin", "feedback_worker"} <= set(by_component)
    assert by_component["feedback_worker"] > 0
    assert set(result["services"]) == set(by_component)
    without_standin = result["cpu_us_per_recipient"] - by_component["ses_standin"]
    assert abs(result["cpu_us_per_recipient_product"] - without_standin) <= 0.2  # rounding

    reference = result["machine_reference_ms"]
    assert reference["start"] > 0 and reference["end"] > 0
    assert all(Path(f).exists() for f in result["files"])
    stall = result["partition_stall"]
    assert stall["max_s"] >= 0 and stall["partition"] in range(settings.partitions)
    assert _live_campaigns(settings) == []


def test_demo_json_has_counts_per_status_duplicates_and_busiest_second(
    settings: Settings,
) -> None:
    code, result = _cli_json(settings, "demo", "--users", "3000", "--workers", "1", "--json")
    assert code == 0, result
    statuses = ("sent", "failed", "skipped", "unknown", "pending", "sending", "cancelled")
    assert sum(result[s] for s in statuses) == result["recipients"] > 0, result
    assert result["sent"] == result["accepted_by_ses"] > 0, result
    assert result["duplicates"] == 0
    assert 0 < result["max_1s_window"] <= result["sent"]
    assert result["status"] == "done"


def test_an_interrupted_chaos_run_prints_its_json_restarts_postgres_and_cancels(
    settings: Settings,
) -> None:
    """Ctrl-C while chaos has PostgreSQL stopped: the JSON still comes, with `error`;
    PostgreSQL is running again and the campaign is cancelled, so the next campaign's
    preflight is not blocked by it."""
    proc = _start_cli(
        settings,
        "chaos",
        "--users",
        "20000",
        "--workers",
        "2",
        "--rate",
        "2000",
        "--kill-every",
        "2",
        "--restart-postgres-at",
        "1",
        "--json",
    )
    try:
        _wait_until(lambda: _campaign_statuses(settings) == ["sending"], 120, proc)
        _wait_until(lambda: not port_open(settings.pg_port), 60, proc)  # PostgreSQL stopped
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=180)
    finally:
        _kill(proc)
    result = _last_json(out, err)
    assert proc.returncode == 1, result
    assert "interrupted" in result["error"], result
    assert result["invariants_ok"] is False
    assert port_open(settings.pg_port)
    assert result["cancelled_on_exit"] == [result["campaign_id"]], result
    assert _live_campaigns(settings) == []


def test_a_bench_stopped_midway_prints_its_json_and_leaves_no_campaign_sending(
    settings: Settings, tmp_path: Path
) -> None:
    proc = _start_cli(
        settings,
        "bench",
        "--users",
        "3000",
        "--sweep-rates",
        "100",
        "--sweep-seconds",
        "60",
        "--pauses",
        "0",
        "--naive-users",
        "10",
        "--out",
        str(tmp_path),
        "--json",
    )
    try:
        # The sweep's campaign (100/s for a minute) is sending: stop the bench there.
        _wait_until(lambda: _campaign_statuses(settings) == ["done", "sending"], 180, proc)
        time.sleep(1.0)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        _kill(proc)
    result = _last_json(out, err)
    assert proc.returncode == 1
    assert "interrupted" in result["error"], result
    assert "send_rate_per_s" in result and "limiter_sweep" not in result
    assert len(result["cancelled_on_exit"]) == 1, result
    assert _live_campaigns(settings) == []
    assert json.loads(Path(result["files"][0]).read_text())["error"] == result["error"]


def _cli_env(settings: Settings) -> dict[str, str]:
    return {**os.environ, **settings_env(settings), "PYTHONUNBUFFERED": "1"}


def _sigint_as_in_a_terminal() -> None:
    """Run in the child before exec: SIGINT at its default, as a terminal's foreground job
    has it (Python then turns it into KeyboardInterrupt). A test run started in the background
    by a non-interactive shell (`make test &` in a script) ignores SIGINT, its children
    inherit that, and the command would run to its end through the test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_cli(settings: Settings, *argv: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "flashsend.cli", *argv],
        env=_cli_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_sigint_as_in_a_terminal,
    )


def _cli_json(settings: Settings, *argv: str) -> tuple[int, dict[str, Any]]:
    proc = _start_cli(settings, *argv)
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        _kill(proc)
    return proc.returncode, _last_json(out, err)


def _last_json(out: str, err: str) -> dict[str, Any]:
    """The result of a `--json` run: its stdout is that one JSON line and nothing else (the
    progress goes to stderr), so `… --json | jq` works."""
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("{"), (
        f"stdout is not one JSON line:\n{out[-2000:]}\nstderr:\n{err[-4000:]}"
    )
    result: dict[str, Any] = json.loads(lines[0])
    return result


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.communicate(timeout=30)


def _wait_until(check: Any, timeout: float, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, f"the command ended early: {proc.communicate()}"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _campaign_statuses(settings: Settings) -> list[str]:
    """Statuses of the test database's campaigns, oldest first ([] while it is unreachable)."""
    try:
        with psycopg.connect(settings.pg_dsn, connect_timeout=2) as conn:
            return [r[0] for r in conn.execute("SELECT status FROM campaigns ORDER BY id")]
    except psycopg.OperationalError:
        return []


def _live_campaigns(settings: Settings) -> list[tuple[int, str]]:
    with psycopg.connect(settings.pg_dsn) as conn:
        rows = conn.execute(
            "SELECT id, status FROM campaigns WHERE status = ANY(%s) ORDER BY id", (list(LIVE),)
        ).fetchall()
    return [(int(i), str(s)) for i, s in rows]
