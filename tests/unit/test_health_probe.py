"""The probes' logic (flashsend.health.Probe): what makes a process alive and ready."""

from __future__ import annotations

import pytest

from flashsend.health import ASSIGNED, Probe


def test_alive_only_while_the_loop_ticks() -> None:
    probe = Probe(stale_s=10.0)
    assert probe.alive(0.0) == (False, "starting: the loop has not ticked yet")
    probe.beat(100.0)
    assert probe.alive(110.0)[0]
    ok, why = probe.alive(110.5)
    assert not ok and "10.5s ago" in why


def test_ready_waits_for_every_start_up_step_whatever_the_order() -> None:
    probe = Probe()
    probe.beat(0.0)
    probe.expect(ASSIGNED, "listening")
    assert probe.ready(1.0) == (False, "waiting for: assigned, listening")
    probe.done("listening")
    probe.done(ASSIGNED)
    assert probe.ready(1.0) == (True, "ready")
    late = Probe()
    late.beat(0.0)
    late.done(ASSIGNED)  # the first seek may come before the app says what it expects
    late.expect(ASSIGNED)
    assert late.ready(1.0)[0]


def test_a_dead_loop_is_not_ready_either() -> None:
    probe = Probe(stale_s=5.0)
    probe.beat(0.0)
    assert not probe.ready(6.0)[0]


def test_a_store_that_does_not_answer_makes_it_unready_and_checks_are_cached() -> None:
    calls = {"pg": 0, "kafka": 0}
    down = {"kafka": True}

    def pg() -> None:
        calls["pg"] += 1

    def kafka() -> None:
        calls["kafka"] += 1
        if down["kafka"]:
            raise ConnectionError("no Kafka broker answered")

    probe = Probe(store_ttl_s=5.0)
    probe.beat(0.0)
    probe.store("postgresql", pg)
    probe.store("kafka", kafka)
    assert probe.ready(1.0) == (False, "kafka: no Kafka broker answered")
    down["kafka"] = False
    assert not probe.ready(4.0)[0]  # cached: a scrape storm does not hammer the stores
    assert calls == {"pg": 1, "kafka": 1}
    probe.beat(6.0)
    assert probe.ready(6.0) == (True, "ready")
    assert calls == {"pg": 2, "kafka": 2}


@pytest.mark.parametrize("error", [RuntimeError(), OSError("refused")])
def test_any_failure_of_a_check_is_a_reason(error: Exception) -> None:
    def check() -> None:
        raise error

    probe = Probe()
    probe.beat(0.0)
    probe.store("db", check)
    ok, why = probe.ready(0.0)
    assert not ok and why.startswith("db: ") and len(why) > len("db: ")
