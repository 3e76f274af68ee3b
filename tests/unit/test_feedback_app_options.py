"""The feedback agent's records bypass Faust's stream and acks, so Faust's stall checks, which
watch that path, are off for its app only; the sender's app keeps them."""

from __future__ import annotations

from flashsend.settings import load_settings
from streams.app import create_app
from streams.feedback_app import FAUST_STALL_CHECKS_OFF_S, create_feedback_app


def test_only_the_feedback_app_turns_faust_stall_checks_off() -> None:
    settings = load_settings(schema_registry_url="mock://options")
    feedback = create_feedback_app(settings)
    assert feedback.conf.stream_processing_timeout == FAUST_STALL_CHECKS_OFF_S
    assert create_app(settings).conf.stream_processing_timeout < 3600
