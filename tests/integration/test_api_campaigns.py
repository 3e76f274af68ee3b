"""Campaign endpoints against the real app and stack: idempotent starts, named audiences,
one error shape, ETags, the event stream's one poller, the audit log (API and CLI)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import psycopg
import pytest

from flashsend.cli.entry import main
from flashsend.settings import Settings, settings_env
from sinks.api_key_store import ApiKeyStore
from sinks.audit_store import Actor
from sinks.users import seed_users
from tests.integration.api_helpers import (
    Api,
    assert_problem,
    audit_rows,
    campaign_status,
    serve,
)
from tests.integration.campaign_helpers import new_campaign, put_template, sending_campaign


def _create(api: Api, **body: Any) -> int:
    with api.client("admin") as client:
        r = client.post("/api/v1/campaigns", json={"name": "api", "rate": 0, **body})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def test_two_concurrent_starts_with_one_idempotency_key_snapshot_once(settings: Settings) -> None:
    seed_users(settings.pg_dsn, 300)
    put_template(settings)
    with serve(settings) as api:
        cid = _create(api)
        barrier = threading.Barrier(2)
        answers: list[httpx.Response] = []

        def start() -> None:
            with api.client("operator") as client:
                barrier.wait()
                answers.append(
                    client.post(
                        f"/api/v1/campaigns/{cid}/start",
                        json={},
                        headers={"Idempotency-Key": "start-once"},
                    )
                )

        threads = [threading.Thread(target=start) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        assert answers[0].json() == answers[1].json()
        assert answers[0].json()["changed"] is True
        replayed = [a.headers.get("idempotent-replayed") for a in answers]
        assert sorted(replayed, key=str) == ["true", None] or replayed.count("true") == 1
        starts = [r for r in audit_rows(settings, cid) if r["action"] == "start"]
        assert len(starts) == 1 and starts[0]["actor"] == "test-operator"
        with psycopg.connect(settings.pg_dsn) as conn:
            rows = conn.execute(
                "SELECT count(*) FROM campaign_recipients WHERE campaign_id = %s", (cid,)
            ).fetchone()
        assert rows is not None and rows[0] == answers[0].json()["recipients"] > 0
        # Started already: a start without a key is a no-op, 200 with the state.
        with api.client("operator") as client:
            again = client.post(f"/api/v1/campaigns/{cid}/start", json={})
        assert again.status_code == 200 and again.json()["changed"] is False


def test_one_idempotency_key_with_another_body_is_422_and_changes_nothing(
    settings: Settings,
) -> None:
    put_template(settings)
    with serve(settings) as api, api.client("admin") as client:
        key = {"Idempotency-Key": "create-1"}
        first = client.post("/api/v1/campaigns", json={"name": "a"}, headers=key)
        assert first.status_code == 201
        again = client.post("/api/v1/campaigns", json={"name": "a"}, headers=key)
        assert again.status_code == 201 and again.json() == first.json()
        assert again.headers["idempotent-replayed"] == "true"
        other = client.post("/api/v1/campaigns", json={"name": "b"}, headers=key)
        body = assert_problem(other, 422)
        assert body["errors"][0]["field"] == "header.Idempotency-Key"
        listed = client.get("/api/v1/campaigns").json()["items"]
        assert [c["name"] for c in listed] == ["a"]
        creates = [r for r in audit_rows(settings) if r["action"] == "create"]
        assert len(creates) == 1


def test_an_unregistered_audience_is_422_and_a_registered_one_is_used(
    settings: Settings,
) -> None:
    with serve(settings) as api, api.client("admin") as client:
        body = assert_problem(
            client.post("/api/v1/campaigns", json={"name": "x", "audience": "vip"}), 422
        )
        assert body["errors"][0]["field"] == "body.audience"
        assert client.get("/api/v1/campaigns").json()["items"] == []
        where = "u.status = 'active' AND u.id % 2 = 0"
        added = client.post("/api/v1/audiences", json={"name": "vip", "where": where})
        assert added.status_code == 201, added.text
        bad = client.post("/api/v1/audiences", json={"name": "bad", "where": "1; DROP TABLE x"})
        assert_problem(bad, 422)
        made = client.post("/api/v1/campaigns", json={"name": "x", "audience": "vip"})
        assert made.status_code == 201
    with psycopg.connect(settings.pg_dsn) as conn:
        row = conn.execute(
            "SELECT audience_condition FROM campaigns WHERE id = %s", (made.json()["id"],)
        ).fetchone()
    assert row is not None and row[0] == where


def test_every_error_path_answers_problem_json(settings: Settings) -> None:
    draft = new_campaign(settings)
    with serve(settings) as api:
        with api.client() as anonymous:
            assert_problem(anonymous.get("/api/v1/campaigns"), 401)
            assert_problem(anonymous.get("/no/such/route"), 404)
        with api.client("viewer") as viewer:
            assert_problem(viewer.post("/api/v1/campaigns", json={"name": "v"}), 403)
            assert_problem(viewer.get("/api/v1/campaigns/999999999999"), 404)
            assert_problem(viewer.get(f"/api/v1/campaigns/{draft}/pause"), 405)
            assert_problem(viewer.get("/api/v1/campaigns/abc"), 422)
            assert_problem(viewer.get("/api/v1/campaigns?limit=0"), 422)
        with api.client("admin") as admin:
            missing = assert_problem(admin.post("/api/v1/campaigns", json={}), 422)
            assert missing["errors"][0]["field"] == "body.name"
            extra = assert_problem(
                admin.post("/api/v1/campaigns", json={"name": "n", "sql": "true"}), 422
            )
            assert extra["errors"][0]["field"] == "body.sql"
            assert_problem(
                admin.post(
                    "/api/v1/campaigns",
                    content=b"{not json",
                    headers={"content-type": "application/json"},
                ),
                422,
            )
            ramp = assert_problem(
                admin.post("/api/v1/campaigns", json={"name": "n", "ramp": "5:100"}), 422
            )
            assert ramp["errors"][0]["field"] == "body.ramp"
            conflict = assert_problem(admin.post(f"/api/v1/campaigns/{draft}/resume", json={}), 409)
            assert conflict["state"] == "draft"
            assert_problem(
                admin.post(f"/api/v1/campaigns/{draft}/promote", json={"variant": "A"}), 422
            )
        assert campaign_status(settings, draft) == "draft"
        assert [r for r in audit_rows(settings) if r["campaign_id"] == draft] == []


def test_pause_is_a_no_op_when_paused_and_every_audit_row_is_a_transition(
    settings: Settings,
) -> None:
    cid = sending_campaign(settings, users=50)
    with serve(settings) as api, api.client("operator") as client:
        first = client.post(f"/api/v1/campaigns/{cid}/pause", json={"reason": "look"})
        assert first.status_code == 200 and first.json()["changed"] is True
        second = client.post(f"/api/v1/campaigns/{cid}/pause")  # no body: the defaults
        assert second.status_code == 200, second.text
        assert second.json() == {**second.json(), "status": "paused", "changed": False}
        client.post(f"/api/v1/campaigns/{cid}/cancel", json={})
        assert_problem(client.post(f"/api/v1/campaigns/{cid}/pause", json={}), 409)
    rows = audit_rows(settings, cid)
    assert [(r["action"], r["state_before"], r["state_after"]) for r in rows] == [
        ("pause", "sending", "paused"),
        ("cancel", "paused", "cancelled"),
    ]
    assert all(r["request_id"] and r["source"] == "127.0.0.1" for r in rows)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("UPDATE audit_log SET actor = 'someone else'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM audit_log")


def test_the_cli_pause_writes_an_audit_row_of_its_user(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    import getpass

    cid = sending_campaign(settings, users=50)
    for name, value in settings_env(settings).items():
        monkeypatch.setenv(name, value)
    assert main(["campaign", "pause", str(cid)]) == 0
    rows = audit_rows(settings, cid)
    assert [(r["actor"], r["action"], r["state_before"], r["state_after"]) for r in rows] == [
        (f"cli:{getpass.getuser()}", "pause", "sending", "paused")
    ]
    assert main(["audit", "--campaign", str(cid), "--json"]) == 0


def test_get_answers_304_to_its_etag(settings: Settings) -> None:
    cid = new_campaign(settings)
    with serve(settings) as api, api.client("viewer") as client:
        first = client.get(f"/api/v1/campaigns/{cid}")
        assert first.status_code == 200 and first.json()["status"] == "draft"
        tag = first.headers["etag"]
        again = client.get(f"/api/v1/campaigns/{cid}", headers={"If-None-Match": tag})
        assert again.status_code == 304 and again.content == b""
        other = client.get(f"/api/v1/campaigns/{cid}", headers={"If-None-Match": '"other"'})
        assert other.status_code == 200


def _frames(lines: Iterator[str], count: int) -> list[dict[str, Any]]:
    """The next `count` frames of a stream (`lines`: its one line iterator, kept by the
    caller: dropping an httpx iterator closes the response)."""
    frames = []
    for line in lines:
        if line.startswith("data: "):
            frames.append(json.loads(line[6:]))
            if len(frames) == count:
                return frames
    raise AssertionError("the stream ended")


def test_many_listeners_share_one_poller(settings: Settings) -> None:
    cid = new_campaign(settings)
    with serve(settings) as api, api.client("viewer") as client, ExitStack() as streams:
        opened = [
            streams.enter_context(client.stream("GET", f"/api/v1/campaigns/{cid}/events"))
            for _ in range(3)
        ]
        readers = [response.iter_lines() for response in opened]
        for response, lines in zip(opened, readers, strict=True):
            assert response.headers["content-type"].startswith("text/event-stream")
            frames = _frames(lines, 2)
            assert {f["id"] for f in frames} == {cid} and frames[0]["status"] == "draft"
            assert "eta_s" in frames[0] and "rate_per_s" in frames[0]
        broadcaster = api.app.state.broadcaster
        assert broadcaster.pollers() == 1
        assert len(broadcaster.feeds[cid].listeners) == 3
        assert_problem(client.get("/api/v1/campaigns/999999999999/events"), 404)


def test_a_stale_unanswered_idempotency_claim_is_taken_over(settings: Settings) -> None:
    """A claim whose request died (no answer, older than STALE_CLAIM_S) does not block the
    retry forever: the retry runs the request; a fresh unanswered claim is waited for."""
    from flashsend.api.models import CampaignCreate
    from flashsend.api.replies import STALE_CLAIM_S, request_hash

    body = {"name": "retried"}
    digest = request_hash("POST", "/api/v1/campaigns", CampaignCreate(**body).model_dump())
    with serve(settings) as api, api.client("admin") as admin:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO idempotency_keys (api_key_id, key, request_hash, created_at) "
                "SELECT id, 'died', %s, now() - make_interval(secs => %s) FROM api_keys "
                "WHERE name = 'test-admin'",
                (digest, STALE_CLAIM_S + 60),
            )
        retry = admin.post("/api/v1/campaigns", json=body, headers={"Idempotency-Key": "died"})
        assert retry.status_code == 201, retry.text
        again = admin.post("/api/v1/campaigns", json=body, headers={"Idempotency-Key": "died"})
        assert again.json() == retry.json() and again.headers["idempotent-replayed"] == "true"
        assert len(admin.get("/api/v1/campaigns").json()["items"]) == 1


def test_an_open_event_stream_ends_when_its_key_is_revoked(settings: Settings) -> None:
    cid = new_campaign(settings)
    with serve(settings) as api:
        key = api.new_key("watcher", "viewer")
        with (
            api.client(key=key) as client,
            client.stream("GET", f"/api/v1/campaigns/{cid}/events") as response,
        ):
            lines = response.iter_lines()
            assert _frames(lines, 1)[0]["id"] == cid
            with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
                ApiKeyStore(conn).revoke("watcher", Actor("cli:test"))
            # The server ends the stream at its next check of the key (every 5 s, about 10
            # frames of 3 lines): 400 lines without the end means it never comes.
            ended = False
            for frames, line in enumerate(lines):
                if line == "event: unauthorized":
                    ended = True
                    break
                assert frames < 400, "the stream goes on after its key was revoked"
        assert ended


def test_a_push_campaign_is_created_with_its_ttl_and_collapse_key(settings: Settings) -> None:
    with serve(settings) as api, api.client("admin") as admin:
        made = admin.post(
            "/api/v1/campaigns",
            json={"name": "p", "channel": "push", "body": "Hi", "ttl_s": 600, "collapse_key": "k"},
        )
        assert made.status_code == 201, made.text
        cid = made.json()["id"]
        bad = assert_problem(admin.post("/api/v1/campaigns", json={"name": "e", "ttl_s": 600}), 422)
        assert bad["errors"][0]["field"] == "body.ttl_s"
        assert_problem(admin.post("/api/v1/campaigns", json={"name": "p", "channel": "push"}), 422)
    with psycopg.connect(settings.pg_dsn) as conn:
        row = conn.execute(
            "SELECT channel, template, push_ttl_s, push_collapse_key FROM campaigns WHERE id = %s",
            (cid,),
        ).fetchone()
    assert row == ("push", "Hi", 600, "k")
