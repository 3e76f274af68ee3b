"""The console's refusals and its reading, in a real browser: a viewer sees no button and a
forged POST with its session is 403; a POST without the CSRF token is 403; an expired session
is back at sign-in; a campaign's name is text, never markup; counts render without JavaScript."""

from __future__ import annotations

import time

from selenium.webdriver.common.by import By

from flashsend.settings import Settings
from tests.integration.api_helpers import audit_rows, campaign_status, serve
from tests.integration.campaign_helpers import sending_campaign, statuses
from tests.integration.console_helpers import (
    browser,
    csrf_of,
    no_alert,
    session_client,
    shown_count,
    shown_status,
    sign_in,
    wait_until,
)

BUTTONS = "section.controls button, section.controls summary, form[action*='/campaigns/'] button"


def test_a_viewer_sees_no_button_and_a_forged_post_is_refused(settings: Settings) -> None:
    cid = sending_campaign(settings, 300)
    with serve(settings) as api, browser() as driver:
        sign_in(driver, api, api.keys["viewer"])
        driver.get(f"{api.url}/console/campaigns/{cid}")
        assert shown_status(driver) == "sending"
        assert driver.find_elements(By.CSS_SELECTOR, BUTTONS) == []
        with session_client(api, driver) as forged:
            for action in ("pause", "cancel", "start"):
                answer = forged.post(
                    f"/console/campaigns/{cid}/{action}", data={"csrf": csrf_of(driver)}
                )
                assert answer.status_code == 403, (action, answer.status_code)
        assert campaign_status(settings, cid) == "sending"
        assert [r["action"] for r in audit_rows(settings, cid)] == []
        # The same page for an operator has the buttons (what the viewer's lacks).
        driver.delete_all_cookies()
        sign_in(driver, api, api.keys["operator"])
        driver.get(f"{api.url}/console/campaigns/{cid}")
        assert driver.find_elements(By.ID, "btn-pause")


def test_a_post_without_the_csrf_token_is_refused_and_with_it_goes_through(
    settings: Settings,
) -> None:
    cid = sending_campaign(settings, 300)
    with serve(settings) as api, browser() as driver:
        sign_in(driver, api, api.keys["operator"])
        with session_client(api, driver) as client:
            assert client.post(f"/console/campaigns/{cid}/pause").status_code == 403
            wrong = client.post(f"/console/campaigns/{cid}/pause", data={"csrf": "x" * 43})
            assert wrong.status_code == 403
            assert campaign_status(settings, cid) == "sending"
            assert audit_rows(settings, cid) == []
            right = client.post(f"/console/campaigns/{cid}/pause", data={"csrf": csrf_of(driver)})
            assert right.status_code == 303, right.text
        assert campaign_status(settings, cid) == "paused"
        assert [(r["actor"], r["action"]) for r in audit_rows(settings, cid)] == [
            ("test-operator", "pause")
        ]


def test_an_expired_session_is_back_at_sign_in(settings: Settings) -> None:
    short = settings.model_copy(update={"console_session_hours": 3.0 / 3600})
    with serve(short) as api, browser() as driver:
        sign_in(driver, api, api.keys["viewer"])
        signed_at = time.monotonic()
        with session_client(api, driver) as kept:  # the cookie, kept past its expiry
            assert kept.get("/console/").status_code == 200
            time.sleep(max(0.0, 3.5 - (time.monotonic() - signed_at)))
            driver.get(f"{api.url}/console/")
            wait_until(lambda: driver.current_url.endswith("/console/sign-in"), "sign-in")
            assert driver.find_elements(By.ID, "key")
            # The server refuses it too, whatever a browser does with the cookie's max-age.
            again = kept.get("/console/")
            assert again.status_code == 303 and again.headers["location"] == "/console/sign-in"
            assert kept.get("/console/campaigns/1/events").status_code == 401


def test_a_campaign_named_like_a_script_renders_as_text(settings: Settings) -> None:
    name = "<script>alert(1)</script>"
    with serve(settings) as api, browser() as driver:
        with api.client("admin") as client:
            made = client.post("/api/v1/campaigns", json={"name": name})
        assert made.status_code == 201, made.text
        cid = made.json()["id"]
        sign_in(driver, api, api.keys["operator"])
        link = driver.find_element(By.CSS_SELECTOR, f"a[href='/console/campaigns/{cid}']")
        assert link.text == name and no_alert(driver)
        driver.get(f"{api.url}/console/campaigns/{cid}")
        assert driver.find_element(By.ID, "campaign-name").text == name
        assert driver.title.startswith(name)
        assert no_alert(driver)


def test_reading_works_with_javascript_off(settings: Settings) -> None:
    cid = sending_campaign(settings, 1_500)
    expected = statuses(settings, cid)
    assert expected["pending"] >= 1_000  # shown with a thousands separator
    with serve(settings) as api, browser(javascript=False) as driver:
        sign_in(driver, api, api.keys["viewer"])
        row = driver.find_element(By.CSS_SELECTOR, f"tr[data-id='{cid}']")
        done = sum(n for k, n in expected.items() if k not in ("pending", "sending", "held"))
        total = sum(expected.values())
        assert "sending" in row.text and f"{done:,} of {total:,}" in row.text
        driver.get(f"{api.url}/console/campaigns/{cid}")
        assert shown_status(driver) == "sending"
        cell = driver.find_element(By.CSS_SELECTOR, "#counts td[data-count='pending']")
        assert cell.text == f"{expected['pending']:,}"
        assert shown_count(driver, "sent") == 0
