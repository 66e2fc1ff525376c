"""Debian's chromium driven headless through its chromedriver (Selenium, nothing downloaded):
the `browser` fixture the dashboard tests share, and what they wait for and find on the page."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

def _browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    if not (Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file()):
        return (
            "Debian's chromium and chromium-driver are not installed "
            "(scripts/test installs them with apt-get when run as root)"
        )
    return None


@pytest.fixture(scope="module")
def browser():
    if why := _browser_missing():
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager never downloads a browser or driver
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def until(driver, condition, timeout: float = 30, message: str = ""):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.2).until(condition, message)


def row(driver, agent: str):
    """The table row of `agent`, found by its id as the page holds it, or None."""
    return driver.execute_script(
        "return [...document.querySelectorAll('#agents tbody tr')].find(tr => tr.dataset.agentId === arguments[0]) || null",
        agent,
    )


def visible(driver, element_id: str) -> bool:
    return driver.find_element("id", element_id).is_displayed()
