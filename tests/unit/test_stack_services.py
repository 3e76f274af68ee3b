"""`flashsend up` starts the configured local services only; `down` stops every one that
runs, configured now or not."""

from __future__ import annotations

from pathlib import Path

from flashsend.settings import Settings
from infra.process import ManagedProcess, pid_alive
from infra.stack import Stack


def test_up_starts_elasticmq_and_the_puller_only_when_configured(tmp_path: Path) -> None:
    default = Stack(Settings(state_dir=tmp_path))
    assert "sqs" not in default.service_names() and "puller" not in default.service_names()
    sqs = Stack(Settings(state_dir=tmp_path, local_services=("kafka", "ses", "sqs", "puller")))
    # The queue's subscription at the stand-in needs the stand-in; the puller, the queue.
    assert sqs.service_names() == ["kafka", "ses", "sqs", "puller"]


def test_down_stops_every_service_whatever_is_configured_now(tmp_path: Path) -> None:
    default = Stack(Settings(state_dir=tmp_path))
    every = default.service_names(every=True)
    assert {"sqs", "puller", "webhook", "registry"} <= set(every)
    # Stopped in reverse start order: the puller before ElasticMQ, ElasticMQ before Kafka.
    assert every.index("puller") > every.index("sqs") > every.index("kafka")
    assert default.down() == []  # nothing runs in an empty state dir


def test_down_stops_an_elasticmq_started_under_other_settings(tmp_path: Path) -> None:
    """`up` with `sqs`, then `down` without it: the server still goes (a stand-in process
    under the service's pid file; down signals it and removes the file)."""
    pid = ManagedProcess("sqs", tmp_path / "run").start(["sleep", "60"])
    assert Stack(Settings(state_dir=tmp_path)).down() == ["sqs"]
    assert not pid_alive(pid)


def test_up_starts_the_api_last_by_default(tmp_path: Path) -> None:
    names = Stack(Settings(state_dir=tmp_path)).service_names()
    assert names[-1] == "api" and "webhook" in names
