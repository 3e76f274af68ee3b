"""The API's keys, roles and budget against the real app over HTTP: no key, wrong and
unknown keys, a viewer pausing, a revoked key, a key over its budget."""

from __future__ import annotations

import psycopg

from flashsend.api.keys import new_key
from flashsend.settings import Settings
from sinks.api_key_store import ApiKeyStore
from sinks.audit_store import Actor
from tests.integration.api_helpers import assert_problem, audit_rows, campaign_status, serve
from tests.integration.campaign_helpers import sending_campaign


def _comparable(body: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in body.items() if k != "request_id"}


def test_no_key_wrong_key_and_unknown_key_get_the_same_401(settings: Settings) -> None:
    with serve(settings) as api:
        real = api.keys["admin"]
        prefix = real.split("_")[1]
        wrong = f"fsk_{prefix}_{'x' * 43}"  # a real prefix, another secret
        unknown, _ = new_key()  # well formed, never stored
        answers = []
        for key in ("", wrong, unknown, "not-a-key"):
            with api.client(key=key) as client:
                answers.append(client.get("/api/v1/campaigns"))
        bodies = [_comparable(assert_problem(r, 401)) for r in answers]
        assert all(b == bodies[0] for b in bodies), bodies
        assert {r.headers["www-authenticate"] for r in answers} == {"Bearer"}
        with api.client("viewer") as client:
            assert client.get("/api/v1/campaigns").status_code == 200


def test_a_viewer_cannot_pause_and_nothing_changes(settings: Settings) -> None:
    cid = sending_campaign(settings, users=50)
    with serve(settings) as api:
        with api.client("viewer") as client:
            body = assert_problem(client.post(f"/api/v1/campaigns/{cid}/pause", json={}), 403)
        assert "operator" in body["detail"]
        assert campaign_status(settings, cid) == "sending"
        assert audit_rows(settings, cid) == []
        with api.client("operator") as client:
            assert client.post(f"/api/v1/campaigns/{cid}/pause", json={}).status_code == 200
        assert campaign_status(settings, cid) == "paused"


def test_a_revoked_key_is_refused_on_its_next_request(settings: Settings) -> None:
    with serve(settings) as api:
        key = api.new_key("soon-revoked", "viewer")
        with api.client(key=key) as client:
            assert client.get("/api/v1/campaigns").status_code == 200
            with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
                ApiKeyStore(conn).revoke("soon-revoked", Actor("cli:test"))
            assert_problem(client.get("/api/v1/campaigns"), 401)
        rows = [r for r in audit_rows(settings) if r["action"] == "api-key revoke"]
        assert [r["detail"]["name"] for r in rows] == ["soon-revoked"]


def test_a_key_over_its_budget_gets_429_with_retry_after(settings: Settings) -> None:
    limited = settings.model_copy(
        update={"api_requests_per_minute": 6.0, "api_requests_burst": 3.0}
    )
    with serve(limited) as api:
        with api.client("viewer") as client:
            answers = [client.get("/api/v1/campaigns") for _ in range(4)]
        assert [r.status_code for r in answers[:3]] == [200, 200, 200]
        assert_problem(answers[3], 429)
        assert int(answers[3].headers["retry-after"]) >= 1
        with api.client("admin") as other:  # the budget is per key
            assert other.get("/api/v1/campaigns").status_code == 200
