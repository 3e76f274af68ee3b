"""The console's screenshots (`make screenshots` writes them to docs/img; the test run writes
them to a temporary directory) and its layout at a phone's width: a campaign mid-send."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from flashsend.errors import Conflict
from flashsend.lab.workers import WorkerPool
from flashsend.settings import Settings
from producers.campaign import start_campaign
from producers.campaign_ops import control_campaign
from sinks.audit_store import Actor
from sinks.users import seed_users
from tests.integration.api_helpers import serve
from tests.integration.campaign_helpers import new_campaign, statuses
from tests.integration.console_helpers import browser, shown_count, sign_in, wait_until

# Where `make screenshots` wants them; unset in `make test` (nothing written to the repo).
TARGET_ENV = "FLASHSEND_SCREENSHOTS_DIR"
PHONE = (390, 844)


def _fits(driver: WebDriver) -> bool:
    """Nothing wider than the window: the page scrolls down, never sideways."""
    width = driver.execute_script("return document.documentElement.scrollWidth")
    inner = driver.execute_script("return window.innerWidth")
    return bool(width <= inner)


def test_screenshots_of_the_list_and_a_campaign_mid_send(
    settings: Settings, tmp_path: Path
) -> None:
    target = Path(os.environ.get(TARGET_ENV) or tmp_path)
    seed_users(settings.pg_dsn, 12_000)
    older = new_campaign(settings, name="weekend newsletter")
    cid = new_campaign(settings, rate=400, name="Black Friday flash sale")
    pool = WorkerPool(settings, settings.state_dir / "logs-screenshots")
    pool.start(1)
    try:
        start_campaign(settings, older)
        start_campaign(settings, cid, actor=Actor("ops-alice"))
        with serve(settings) as api, browser() as driver:
            sign_in(driver, api, api.keys["operator"])
            driver.get(f"{api.url}/console/campaigns/{cid}")
            wait_until(lambda: shown_count(driver, "sent") > 2_000, "a campaign mid-send", 120)
            driver.set_window_size(1280, 1400)  # the page down to the feedback rates
            driver.save_screenshot(str(target / "console-campaign.png"))
            driver.set_window_size(1280, 800)
            driver.get(f"{api.url}/console/")
            driver.find_element(By.CSS_SELECTOR, f"tr[data-id='{cid}']")
            driver.save_screenshot(str(target / "console-campaigns.png"))
            assert statuses(settings, cid).get("pending", 0) > 0  # still mid-send
            driver.set_window_size(*PHONE)
            for page in ("/console/", f"/console/campaigns/{cid}"):
                driver.get(f"{api.url}{page}")
                assert _fits(driver), page
    finally:
        with contextlib.suppress(Conflict):  # finished already
            control_campaign(settings, cid, "cancel", "screenshots taken", Actor("test"))
        pool.stop()
    for name in ("console-campaigns.png", "console-campaign.png"):
        assert (target / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
