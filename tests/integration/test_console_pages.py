"""The console's other pages in a real browser: Cancel asks first, naming the campaign and
its counts; suppressions are searched, added and removed with a reason (audited); a template
is previewed for a sample user."""

from __future__ import annotations

from selenium.webdriver.common.by import By

from flashsend.settings import Settings
from sinks.users import seed_users
from tests.integration.api_helpers import audit_rows, campaign_status, serve
from tests.integration.campaign_helpers import put_template, sending_campaign, statuses
from tests.integration.console_helpers import browser, shown_status, sign_in, wait_until


def test_cancel_asks_first_naming_the_campaign_and_its_counts(settings: Settings) -> None:
    cid = sending_campaign(settings, 1_500)
    pending = statuses(settings, cid)["pending"]
    with serve(settings) as api, browser() as driver:
        sign_in(driver, api, api.keys["operator"])
        driver.get(f"{api.url}/console/campaigns/{cid}")
        confirm = driver.find_element(By.ID, "btn-cancel-confirm")
        assert not confirm.is_displayed()  # one click is not enough
        driver.find_element(By.ID, "btn-cancel").click()
        question = driver.find_element(By.CSS_SELECTOR, "details.confirm form p").text
        assert f"“t” (#{cid})" in question and f"{pending:,} pending" in question
        driver.find_element(By.ID, "cancel-reason").send_keys("wrong price")
        confirm.click()
        wait_until(lambda: shown_status(driver) == "cancelled", "cancelled")
    assert campaign_status(settings, cid) == "cancelled"
    [row] = audit_rows(settings, cid)
    assert (row["actor"], row["action"], row["detail"]) == (
        "test-operator",
        "cancel",
        {"reason": "wrong price"},
    )


def test_an_admin_searches_adds_and_removes_a_suppression(settings: Settings) -> None:
    address = "buyer@example.com"
    with serve(settings) as api, browser() as driver:
        sign_in(driver, api, api.keys["admin"])
        driver.get(f"{api.url}/console/suppressions")
        driver.find_element(By.ID, "add-address").send_keys(address)
        driver.find_element(By.ID, "add-reason").send_keys("asked by phone")
        driver.find_element(By.CSS_SELECTOR, "form[action$='/add'] button").click()
        wait_until(lambda: "add: buyer@example.com" in driver.page_source, "the add's note")
        driver.find_element(By.ID, "s-address").send_keys(address)
        driver.find_element(By.CSS_SELECTOR, "form[role=search] button").click()
        rows = driver.find_elements(By.CSS_SELECTOR, "#suppressions tbody tr")
        assert len(rows) == 1 and address in rows[0].text and "manual" in rows[0].text
        driver.find_element(By.ID, "rm-reason").send_keys("a mistake")
        driver.find_element(By.CSS_SELECTOR, "form[action$='/remove'] button").click()
        wait_until(lambda: "remove: buyer@example.com" in driver.page_source, "the remove")
        driver.get(f"{api.url}/console/suppressions?address={address}")
        assert "is not suppressed" in driver.find_element(By.ID, "suppressions").text
    changes = [(r["action"], r["actor"]) for r in audit_rows(settings)]
    assert changes[-2:] == [("suppression add", "test-admin"), ("suppression remove", "test-admin")]


def test_a_template_is_previewed_for_a_sample_user(settings: Settings) -> None:
    seed_users(settings.pg_dsn, 10)
    put_template(settings)
    with serve(settings) as api, browser() as driver:
        sign_in(driver, api, api.keys["admin"])
        driver.get(f"{api.url}/console/templates")
        driver.find_element(By.LINK_TEXT, "flash_sale").click()
        driver.find_element(By.CSS_SELECTOR, "form.filters button").click()
        subject = driver.find_element(By.XPATH, "//p[strong='Subject:']").text
        assert "the flash sale starts now" in subject and "{{" not in subject
        frame = driver.find_element(By.CSS_SELECTOR, "iframe.preview")
        assert frame.get_attribute("sandbox") == ""
        driver.switch_to.frame(frame)
        assert "50% off" in driver.find_element(By.TAG_NAME, "body").text


def test_the_key_flashsend_up_prints_signs_in_to_the_console(settings: Settings) -> None:
    from flashsend.cli.stack import console_key

    printed = console_key(settings)
    key = printed.split(",")[0]
    with serve(settings) as api, browser() as driver:
        sign_in(driver, api, key)
        assert "(admin)" in driver.find_element(By.CSS_SELECTOR, "header .who").text
        [cookie] = [c for c in driver.get_cookies() if c["name"] == "flashsend_session"]
        # HttpOnly, SameSite=Strict; Secure only over https (this page is http).
        assert (cookie["httpOnly"], cookie["sameSite"], cookie["secure"]) == (True, "Strict", False)
        assert "expiry" in cookie  # not a browser-session cookie: it ends when the session does


def test_an_operator_promotes_a_variant_and_releases_a_seed_hold(settings: Settings) -> None:
    seed_users(settings.pg_dsn, 400)
    put_template(settings)
    with serve(settings) as api, browser() as driver:
        with api.client("admin") as admin:
            ab = admin.post(
                "/api/v1/campaigns",
                json={
                    "name": "ab",
                    "variants": ["A=flash_sale:10", "B=flash_sale:10"],
                    "winner_by": "manual",
                },
            ).json()["id"]
            held = admin.post("/api/v1/campaigns", json={"name": "held"}).json()["id"]
        with api.client("operator") as operator:
            assert operator.post(f"/api/v1/campaigns/{ab}/start", json={}).status_code == 200
            started = operator.post(
                f"/api/v1/campaigns/{held}/start",
                json={"seed_list": ["seed@example.com"], "hold": "2h"},
            )
            assert started.status_code == 200, started.text
        sign_in(driver, api, api.keys["operator"])
        driver.get(f"{api.url}/console/campaigns/{ab}")
        driver.find_element(By.XPATH, "//button[normalize-space()='Promote B']").click()
        wait_until(
            lambda: (
                "Winner: B" in driver.page_source.replace("<strong>", "").replace("</strong>", "")
            ),
            "the winner",
        )
        driver.get(f"{api.url}/console/campaigns/{held}")
        assert (
            "The audience waits until"
            in driver.find_element(By.ID, "h-seeds").find_element(By.XPATH, "..").text
        )
        driver.find_element(By.ID, "btn-release").click()
        wait_until(lambda: not driver.find_elements(By.ID, "btn-release"), "released")
        assert "Released" in driver.find_element(By.ID, "h-seeds").find_element(By.XPATH, "..").text
    actions = {(r["campaign_id"], r["action"], r["actor"]) for r in audit_rows(settings)}
    assert {(ab, "promote", "test-operator"), (held, "release", "test-operator")} <= actions
