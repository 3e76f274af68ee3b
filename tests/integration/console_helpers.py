"""The console in a real browser for integration tests: the system's headless Chromium
(Debian `chromium` + `chromium-driver`, installed by `make`) driven by Selenium."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import httpx
from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.chrome.webdriver import WebDriver
from selenium.webdriver.common.by import By

from tests.integration.api_helpers import Api

T = TypeVar("T")


def chromium_paths() -> tuple[str, str]:
    """(browser, driver), or an AssertionError saying how to install them."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    assert browser and driver, "no chromium/chromedriver: run make (it installs them)"
    return browser, driver


@contextmanager
def browser(javascript: bool = True, width: int = 1280, height: int = 800) -> Iterator[WebDriver]:
    binary, driver_path = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root in a container
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    if not javascript:
        options.add_experimental_option(
            "prefs", {"profile.managed_default_content_settings.javascript": 2}
        )
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(driver_path))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def sign_in(driver: WebDriver, api: Api, key: str) -> None:
    driver.get(f"{api.url}/console/sign-in")
    driver.find_element(By.ID, "key").send_keys(key)
    driver.find_element(By.CSS_SELECTOR, "form[action='/console/sign-in'] button").click()
    wait_until(lambda: driver.current_url.endswith("/console/"), "the campaigns page")


def wait_until(check: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
        except Exception:  # the page is between two loads
            found = None
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def shown_count(driver: WebDriver, status: str) -> int:
    """A count per status as the campaign page's counts table shows it ('1,234' → 1234)."""
    cell = driver.find_element(By.CSS_SELECTOR, f"#counts td[data-count='{status}']")
    return int(cell.text.replace(",", ""))


def shown_status(driver: WebDriver) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, "[data-field='status']").text)


def no_alert(driver: WebDriver) -> bool:
    try:
        text = driver.switch_to.alert.text
    except NoAlertPresentException:
        return True
    raise AssertionError(f"a dialog opened: {text!r}")


def session_client(api: Api, driver: WebDriver) -> httpx.Client:
    """An HTTP client holding the browser's session cookie (what a forged request sends)."""
    cookies = {c["name"]: c["value"] for c in driver.get_cookies()}
    return httpx.Client(base_url=api.url, cookies=cookies, timeout=60.0, follow_redirects=False)


def csrf_of(driver: WebDriver) -> str:
    """The session's CSRF token, from the sign-out form every page has."""
    field = driver.find_element(By.CSS_SELECTOR, "form[action='/console/sign-out'] [name=csrf]")
    return str(field.get_attribute("value"))
