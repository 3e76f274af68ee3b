"""`flashsend feedback bench` measures both ingest paths: the webhook and SQS → events pull.
Each drains what it was given, once; the top level reports the faster path."""

from __future__ import annotations

from flashsend.lab.feedback_bench import BenchOptions, run_bench
from flashsend.settings import Settings


def test_feedback_bench_reports_every_path_and_the_fastest_on_top(sqs_settings: Settings) -> None:
    result = run_bench(
        sqs_settings,
        BenchOptions(events=2000, concurrency=8, processes=1, agent=False, pullers=4),
        log=print,
    )
    print(result)
    paths = result["paths"]
    assert set(paths) == {"webhook", "firehose", "sqs"}
    sqs = paths["sqs"]
    assert sqs["records"] == 2000 and sqs["duplicates"] == 0 and sqs["left_in_queue"] == 0
    assert sqs["puller"]["deleted"] == 2000
    # Ten messages per ReceiveMessage, and long polls: the queue was full, so the receives
    # are the 200 full ones and a few at the end (a short poll would spin on the empty queue).
    assert 200 <= sqs["puller"]["receives"] <= 200 + 2 * 4
    assert sqs["events_per_s"] > 0 and sqs["cpu_us_per_event"] > 0
    assert "sqs_server_cpu_us_per_event" in sqs
    assert sqs["sqs_server"].startswith("ElasticMQ, the stack's")  # the session's, not a new one
    assert paths["webhook"]["records_on_kafka"] == 2000
    firehose = paths["firehose"]
    assert firehose["records_on_kafka"] == 2000 and firehose["requests"] == 4  # 500 a request
    assert firehose["events_per_s"] > 0 and firehose["cpu_us_per_event"] > 0
    best = max(paths, key=lambda p: paths[p]["events_per_s"])
    assert result["best_path"] == best
    assert result["events_per_s"] == paths[best]["events_per_s"]
    assert result["cpu_us_per_event"] == paths[best]["cpu_us_per_event"]
