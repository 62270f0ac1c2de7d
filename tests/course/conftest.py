"""Headless Chromium for the course's browser tests (JupyterLab in test_lab.py, the built site in
test_site.py): Debian's chromium and chromium-driver, driven by selenium."""

import os

import pytest

CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromedriver")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-first-run", "--window-size=1400,1000")


@pytest.fixture(scope="module")
def chrome():
    """A factory of headless Chromium drivers (``chrome(console=True)`` also records the browser
    console); every driver it made quits with the module. Skips with what to install when
    Chromium is missing."""
    browser, driver_path = CHROMIUM
    if not (os.path.exists(browser) and os.path.exists(driver_path)):
        pytest.skip("the browser test needs Debian's chromium and chromium-driver packages "
                    "(`apt-get install chromium chromium-driver`; `make test` installs them when "
                    "it runs as root)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    drivers = []

    def make(console: bool = False):
        options = webdriver.ChromeOptions()
        options.binary_location = browser
        for flag in FLAGS:
            options.add_argument(flag)
        if console:
            options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        drivers.append(webdriver.Chrome(service=Service(driver_path), options=options))
        return drivers[-1]

    yield make
    for driver in drivers:
        driver.quit()
