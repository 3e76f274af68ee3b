"""`flashsend bench --brokers N` measures only on a cluster of N brokers: on another it stops
before starting anything, with the one line that says how to start the right stack."""

from __future__ import annotations

from pathlib import Path

import psycopg

from flashsend.lab.bench import BenchOptions, run_bench
from flashsend.settings import Settings


def test_bench_refuses_a_stack_with_another_broker_count(
    settings: Settings, tmp_path: Path
) -> None:
    options = BenchOptions(users=100, workers=1, brokers=3, out_dir=tmp_path)
    result = run_bench(settings, options, log=lambda _m: None)
    assert result["brokers"] == 1
    assert "FLASHSEND_KAFKA_BROKERS=3 flashsend up" in result["error"], result
    with psycopg.connect(settings.pg_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM campaigns").fetchone()
    assert row is not None and row[0] == 0  # nothing was started
