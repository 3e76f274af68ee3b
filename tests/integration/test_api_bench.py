"""`flashsend api bench` on a small campaign, beside the API `flashsend up` runs: every figure
is there, its key revoked, its campaign cancelled (no figure is judged: they depend on the
machine)."""

from __future__ import annotations

from flashsend.lab.api_bench import ApiBenchOptions, run_api_bench
from flashsend.settings import Settings
from infra.api_service import ApiService
from infra.process import free_port
from tests.integration.api_helpers import audit_rows, campaign_status


def test_api_bench_reports_its_figures_and_cleans_up(settings: Settings) -> None:
    options = ApiBenchOptions(
        users=6_000, workers=1, gets=20, listeners=4, sse_seconds=1.5, rate=300
    )
    # The stack's own API, as after `flashsend up`: the bench runs a second one beside it.
    stack_api = ApiService(settings.model_copy(update={"api_port": free_port()}))
    stack_api.start()
    try:
        result = run_api_bench(settings, options, lambda line: None)
        assert stack_api.running()
    finally:
        stack_api.stop()
    assert "error" not in result, result
    assert result["get_campaign_ms"]["n"] == 20
    assert result["sse"]["listeners"] == 4 and result["sse"]["frames_per_listener_per_s"] > 0
    assert result["pause_via_api_ms"] is not None and result["pause_settled"] is True
    cid = result["campaign_id"]
    assert campaign_status(settings, cid) == "cancelled" and result["cancelled_on_exit"] == [cid]
    actions = [r["action"] for r in audit_rows(settings)]
    assert actions[-1] == "api-key revoke" and "pause" in actions
