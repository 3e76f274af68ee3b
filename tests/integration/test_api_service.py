"""`flashsend api` as the local stack starts it: a process of its own on its port, with its
pid and log in the state dir; probes and metrics answer without a key."""

from __future__ import annotations

import httpx

from flashsend.settings import Settings
from infra.api_service import ApiService
from infra.process import free_port
from tests.integration.api_helpers import assert_problem


def test_the_stack_service_serves_probes_metrics_and_the_api(settings: Settings) -> None:
    settings = settings.model_copy(update={"api_port": free_port()})
    service = ApiService(settings)
    assert service.start() > 0
    try:
        assert service.running() and service.process.log_file.exists()
        with httpx.Client(base_url=service.endpoint, timeout=10) as client:
            assert client.get("/healthz").json() == {"ok": True}
            assert client.get("/readyz").json() == {"ok": True}
            assert_problem(client.get("/api/v1/campaigns"), 401)
            metrics = client.get("/metrics")
            assert metrics.status_code == 200
            assert (
                'flashsend_api_requests_total{method="GET",route="/api/v1/campaigns",status="401"}'
                in metrics.text
            )
        assert service.start() == 0.0  # already running: left alone
    finally:
        assert service.stop()
    assert not service.running()
