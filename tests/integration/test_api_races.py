"""Pause and resume pressed at once by several operators through the API while a campaign
sends: one defined final state (the last transition in the audit log), every audit row a
transition that happened, and nobody mailed twice (judged at the SES stand-in)."""

from __future__ import annotations

import itertools
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from sinks.users import seed_users
from tests.integration.api_helpers import audit_rows, campaign_status, serve
from tests.integration.campaign_helpers import put_template, stats, statuses, wait_finished

KEYS = 4
REQUESTS = 200


def test_concurrent_pause_and_resume_end_in_the_last_audited_state(settings: Settings) -> None:
    seed_users(settings.pg_dsn, 6_000)
    put_template(settings)
    pool = WorkerPool(settings, settings.state_dir / "logs-api-race")
    with serve(settings) as api:
        keys = [api.new_key(f"operator-{i}", "operator") for i in range(KEYS)]
        with api.client("admin") as admin:
            # Slow enough to outlast the presses: `done` (reconcile's) has no audit row.
            cid = admin.post("/api/v1/campaigns", json={"name": "race", "rate": 150}).json()["id"]
        pool.start(1)
        try:
            with api.client("operator") as client:
                started = client.post(f"/api/v1/campaigns/{cid}/start", json={})
            assert started.status_code == 200, started.text
            deadline = time.monotonic() + 60
            while statuses(settings, cid).get("sent", 0) < 200:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            rng = random.Random(7)
            plan = [(keys[i % KEYS], rng.choice(("pause", "resume"))) for i in range(REQUESTS)]

            def press(key_action: tuple[str, str]) -> httpx.Response:
                key, action = key_action
                with api.client(key=key) as client:
                    return client.post(f"/api/v1/campaigns/{cid}/{action}", json={})

            with ThreadPoolExecutor(max_workers=8) as executor:
                answers = list(executor.map(press, plan))
            assert {a.status_code for a in answers} <= {200, 409}, {
                a.status_code: a.text for a in answers
            }
            changed = sum(1 for a in answers if a.status_code == 200 and a.json()["changed"])
            final = campaign_status(settings, cid)
            rows = [r for r in audit_rows(settings, cid) if r["action"] in ("pause", "resume")]
            assert rows and rows[-1]["state_after"] == final
            assert len(rows) == changed  # one row per transition that happened
            chain = [("start", "draft", "sending")] + [
                (r["action"], r["state_before"], r["state_after"]) for r in rows
            ]
            for (_, _, after), (action, before, now) in itertools.pairwise(chain):
                assert before == after and before != now, chain
                assert (action, now) in {("pause", "paused"), ("resume", "sending")}
            assert {r["actor"] for r in rows} <= {f"operator-{i}" for i in range(KEYS)}
            if final == "paused":
                with api.client("operator") as client:
                    assert (
                        client.post(f"/api/v1/campaigns/{cid}/resume", json={}).status_code == 200
                    )
            wait_finished(settings, cid, pool, timeout=180)
        finally:
            pool.stop()
    st = statuses(settings, cid)
    s = stats(settings, cid)
    assert s["duplicates"] == 0 and s["accepted"] == st["sent"]
