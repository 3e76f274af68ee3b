"""The deliverability loop end to end on the real stack: SES stand-in → signed SNS → webhook
process → mail.events → feedback worker → PostgreSQL → the sender's next batch."""

from __future__ import annotations

from pathlib import Path

from flashsend.lab.feedback_e2e import E2eOptions, run_e2e
from flashsend.settings import Settings


def test_complaints_pause_the_campaign_and_bounces_are_suppressed(
    settings: Settings, tmp_path: Path
) -> None:
    """The issue's 50,000-recipient scenario, scaled down (thresholds lowered to match):
    0.3 % complaints and 2 % hard bounces injected by the stand-in. `flashsend feedback e2e`
    runs the full-size version."""
    result = run_e2e(
        settings,
        E2eOptions(users=6_000, rate=300, min_sample=500, workers=1, timeout_s=120),
        log=lambda _: None,
        log_dir=tmp_path,
    )
    c1, c2 = result["campaign_1"], result["campaign_2"]
    assert c1["status"] == "paused", result
    assert c1["reason"].startswith("auto: complaint rate"), result
    assert c1["rows"].get("pending", 0) > 0, "paused while recipients were left"
    assert result["suppression_matches"], result
    assert c1["injected_bounces"] > 0 and c1["injected_complaints"] > 0
    assert c2["suppressed_reaching_ses"] == 0, result
    # The crossing event is found on mail.events and the delay to the pause is measured.
    assert result["crossing"]["reason"].startswith("auto: complaint rate"), result
    assert isinstance(result["seconds_from_crossing_to_pause"], float), result
    assert result["crossing"]["seconds_to_applied"] is not None, result
    assert c2["reached_ses"] == c1["rows"]["sent"] - result["suppressed"], result
    assert result["ok"], result
