"""A bulk call's clock, against the SES stand-in over HTTP with the real boto3 client: the
request leaves no earlier than `not_before`, and the instants the clock records bracket the
moment the stand-in accepted the call, which is what a lane's window relies on."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sinks.ses import BulkEntry, CallClock, SesCallFailed, SesSender
from tests.integration.ses_helpers import StandinProcess, start_standin

SENDER = "Shop <shop@example.com>"
# The stand-in's per-millisecond buckets are floored, and wall time is read apart from the
# monotonic clock the call's instants use: a little tolerance either side.
SLOP_S = 0.003


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandinProcess]:
    process = start_standin(tmp_path_factory.mktemp("ses") / "state")
    process.admin.ensure_template("promo", "Hi {{name}}", text="Hello {{name}}")
    yield process
    process.stop()


def send(standin: StandinProcess, campaign: str, clock: CallClock) -> int:
    sender = SesSender(standin.client(validate=False))
    entries = [BulkEntry(f"{campaign}{i}@example.com", {"name": f"N{i}"}) for i in range(3)]
    statuses = sender.send_bulk(
        from_address=SENDER,
        template="promo",
        entries=entries,
        default_tags={"campaign": campaign},
        clock=clock,
    )
    return sum(1 for s in statuses if s.status == "SUCCESS")


def accepted_at(standin: StandinProcess, campaign: str) -> list[float]:
    """Wall-clock instants (to the millisecond) at which the stand-in accepted mail."""
    return [t for t, n in standin.admin.rate(campaign, bucket_ms=1) if n]


def test_the_request_waits_until_not_before_and_the_clock_brackets_acceptance(
    standin: StandinProcess,
) -> None:
    standin.admin.set_faults(latency_ms=150.0)  # slept before the stand-in accepts
    try:
        wall = time.time() - time.monotonic()
        asked = time.monotonic()
        clock = CallClock(not_before=asked + 0.3)
        assert send(standin, "clock-a", clock) == 3
        returned = time.monotonic()
    finally:
        standin.admin.set_faults(latency_ms=0.0)
    assert clock.sent_at is not None and clock.answered_at is not None
    assert clock.not_before <= clock.sent_at  # how soon after is the machine's, not a promise
    assert clock.answered_at - clock.sent_at >= 0.15  # read after the answer, not before
    assert clock.answered_at <= returned
    [accepted] = accepted_at(standin, "clock-a")
    assert clock.sent_at + wall - SLOP_S <= accepted <= clock.answered_at + wall + SLOP_S


def test_a_not_before_in_the_past_does_not_hold_the_request(standin: StandinProcess) -> None:
    began = time.monotonic()
    clock = CallClock(not_before=began - 5.0)
    assert send(standin, "clock-c", clock) == 3
    assert clock.sent_at is not None and clock.sent_at - began < 1.0


def test_an_error_answer_is_timed_too(standin: StandinProcess) -> None:
    standin.admin.set_faults(refuse_addresses="^clock-b1@")  # the whole call refused, 400
    clock = CallClock()
    try:
        with pytest.raises(SesCallFailed) as failed:
            send(standin, "clock-b", clock)
    finally:
        standin.admin.set_faults(refuse_addresses="")
    assert failed.value.http_status == 400
    assert clock.sent_at is not None and clock.answered_at is not None
    assert clock.sent_at <= clock.answered_at
    assert accepted_at(standin, "clock-b") == []
