"""`bench_sqs_path` (for `flashsend feedback bench`): it drains what it filled, once each, and
reports the figures the bench prints."""

from __future__ import annotations

from pathlib import Path

from flashsend.lab.sqs_bench import bench_sqs_path
from flashsend.settings import Settings


def test_bench_sqs_path_measures_the_puller(sqs_settings: Settings, tmp_path: Path) -> None:
    result = bench_sqs_path(sqs_settings, events=8000, pullers=4, log_dir=tmp_path, log=print)
    print(result)
    assert result["records"] == 8000 and result["duplicates"] == 0
    assert result["left_in_queue"] == 0
    assert result["events_per_s"] > 0 and result["cpu_us_per_event"] > 0
    assert result["puller"]["deleted"] == 8000
    assert "sqs_server_cpu_us_per_event" in result
