"""A Kafka outage during a campaign loses no bounce or complaint: `flashsend feedback outage`
scaled down (20 s instead of 180 s; the command takes the duration as --seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flashsend.lab.feedback_outage import OutageOptions, run_outage
from flashsend.settings import Settings
from tests.conftest import LocalStack


def test_sqs_path_keeps_every_bounce_and_complaint_through_a_broker_outage(
    stack: LocalStack, sqs_settings: Settings, tmp_path: Path
) -> None:
    if not stack.owned:
        pytest.skip("stops the broker: only on the session's own stack, not a reused one")
    result = run_outage(
        sqs_settings,
        OutageOptions(
            seconds=20,
            path="sqs",
            users=3000,
            rate=150,
            p_bounce=0.03,
            p_complaint=0.01,
            outage_when_sent=0.1,
            timeout_s=240,
        ),
        log=print,
        log_dir=tmp_path,
    )
    print(result)
    assert result["ok"], result
    assert result["outage_s"] >= 20
    assert result["injected_bounces"] > 0 and result["injected_complaints"] > 0
    assert result["lost"] == [] and result["extra"] == []
    # The outage held events back: SQS kept them while the puller could not publish.
    assert result["recipients_sent_during_outage"] > 0
    assert result["events_held_in_sqs_max"] > 0
