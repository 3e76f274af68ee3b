"""Short versions of the long-running commands (`flashsend chaos`, `flashsend bench`): the same
code paths on small numbers, so the commands cannot rot. Figures come from the commands."""

from __future__ import annotations

from pathlib import Path

from flashsend.bench import BenchOptions, run_bench
from flashsend.chaos import ChaosOptions, run_chaos
from flashsend.settings import Settings


def test_chaos_kills_restarts_zombie_and_hangs_keep_the_invariants(settings: Settings) -> None:
    result = run_chaos(
        settings,
        ChaosOptions(
            users=8_000,
            workers=3,
            rate=2_000,
            kill_every_s=6,
            restart_broker_at=8,
            restart_postgres_at=16,
            zombie_at=4,
            ses_hang_rate=0.01,
            lease_s=15,
            timeout_s=240,
        ),
        log=lambda _: None,
    )
    assert result["kills"] >= 1
    assert result["broker_restarts"] == 1 and result["postgres_restarts"] == 1
    assert result["zombies"] == 1
    assert result["duplicates"] == 0, result
    assert result["lost"] == 0, result
    assert result["invariants_ok"], result


def test_bench_short_run_produces_every_figure(settings: Settings, tmp_path: Path) -> None:
    result = run_bench(
        settings,
        BenchOptions(
            users=6_000, workers=2, naive_users=300, limiter_seconds=4, pauses=2, out_dir=tmp_path
        ),
        log=lambda _: None,
    )
    for key in (
        "snapshot_s",
        "seed_snapshot_s",
        "produce_s",
        "send_rate_per_s",
        "cpu_us_per_recipient",
        "limiter_ratio_600",
        "limiter_ratio_3000",
        "pause_latency_ms",
        "status_query_ms",
        "end_to_end_s",
        "naive_rate_per_s",
        "speedup_vs_naive",
        "machine_reference_ms",
        "product_cpu_us_per_recipient",
        "standin_cpu_us_per_recipient",
        "services",
    ):
        assert key in result, key
    by_component = result["cpu_us_per_recipient_by_component"]
    assert {"ses", "ses_emitter", "workers", "kafka"} <= set(by_component)
    standin = by_component["ses"] + by_component["ses_emitter"]
    assert abs(result["standin_cpu_us_per_recipient"] - standin) < 0.2
    assert result["services"]["measured"] == sorted(by_component)
    assert result["duplicates"] == 0
    assert result["pending"] == 0
    assert result["speedup_vs_naive"] > 1
    reference = result["machine_reference_ms"]
    assert 0 < reference["start"] < 10_000 and 0 < reference["end"] < 10_000
    assert all(Path(f).exists() for f in result["files"])
    stall = result["partition_stall"]
    assert 0 <= stall["max_s"] < 60 and stall["partition"] in range(settings.partitions)
