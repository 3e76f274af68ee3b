"""The console in a real browser driving a real campaign: sign in, create, start, watch the
counts move, Pause (judged at the SES stand-in), Resume, done with the API's counts."""

from __future__ import annotations

import time

from selenium.webdriver.common.by import By

from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from sinks.users import seed_users
from tests.integration.api_helpers import audit_rows, serve
from tests.integration.campaign_helpers import put_template, stats, statuses
from tests.integration.console_helpers import (
    browser,
    shown_count,
    shown_status,
    sign_in,
    wait_until,
)

COUNTS = ("pending", "sending", "sent", "failed", "unknown", "skipped", "cancelled", "held")
PAUSE_PROMISE_S = 1.0  # the promise: nothing accepted later than this after the click
QUIET_S = 2.0  # no acceptance for this long: the stand-in has seen the last one


def _last_acceptance_once_quiet(settings: Settings, cid: int) -> float | None:
    """The stand-in's last acceptance of the campaign, once none came for QUIET_S."""
    seen = stats(settings, cid)
    quiet_since = time.monotonic()
    while time.monotonic() - quiet_since < QUIET_S:
        time.sleep(0.2)
        now = stats(settings, cid)
        if now["accepted"] != seen["accepted"]:
            seen, quiet_since = now, time.monotonic()
    return seen["last_ts"]


def test_an_operator_starts_watches_pauses_and_resumes_a_campaign(settings: Settings) -> None:
    seed_users(settings.pg_dsn, 20_000)
    put_template(settings)
    pool = WorkerPool(settings, settings.state_dir / "logs-console")
    pool.start(1)
    try:
        with serve(settings) as api, browser() as driver:
            # An admin creates the draft (operators may not create), then signs out.
            sign_in(driver, api, api.keys["admin"])
            driver.find_element(By.CSS_SELECTOR, "details.create summary").click()
            driver.find_element(By.ID, "c-name").send_keys("flash friday")
            rate = driver.find_element(By.ID, "c-rate")
            rate.clear()
            rate.send_keys("800")
            driver.find_element(By.CSS_SELECTOR, "details.create button").click()
            wait_until(lambda: "/console/campaigns/" in driver.current_url, "the new campaign")
            cid = int(driver.current_url.split("/console/campaigns/")[1].split("?")[0])
            driver.find_element(By.CSS_SELECTOR, "form[action='/console/sign-out'] button").click()
            wait_until(lambda: driver.current_url.endswith("/console/sign-in"), "signed out")

            sign_in(driver, api, api.keys["operator"])
            driver.get(f"{api.url}/console/campaigns/{cid}")
            driver.find_element(By.ID, "btn-start").click()
            wait_until(lambda: shown_status(driver) == "sending", "sending")
            first = wait_until(lambda: shown_count(driver, "sent"), "a first count", 60)
            second = wait_until(
                lambda: (n := shown_count(driver, "sent")) != first and n, "the count to move"
            )
            assert second != first and driver.current_url.endswith(f"/campaigns/{cid}")

            clicked_at = time.time()
            driver.find_element(By.ID, "btn-pause").click()
            wait_until(lambda: shown_status(driver) == "paused", "paused")
            last = _last_acceptance_once_quiet(settings, cid)
            assert last is not None and last <= clicked_at + PAUSE_PROMISE_S, (
                last - clicked_at if last else None
            )
            assert statuses(settings, cid).get("pending", 0) > 0  # paused mid-send

            driver.find_element(By.ID, "btn-resume").click()
            wait_until(lambda: shown_status(driver) in ("sending", "done"), "resumed")
            wait_until(lambda: shown_status(driver) == "done", "done", timeout=180)
            shown = {k: shown_count(driver, k) for k in COUNTS}
            with api.client("viewer") as client:
                reported = client.get(f"/api/v1/campaigns/{cid}").json()
            assert shown == {k: reported[k] for k in COUNTS}
            assert shown["sent"] == stats(settings, cid)["accepted"] > 0
            actions = [(r["actor"], r["action"]) for r in audit_rows(settings, cid)]
            assert actions == [
                ("test-admin", "create"),
                ("test-operator", "start"),
                ("test-operator", "pause"),
                ("test-operator", "resume"),
            ]
    finally:
        pool.stop()
