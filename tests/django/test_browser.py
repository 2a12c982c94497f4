"""The admin in a real browser: log in, history, filter by job, run now, see the run.

Debian's Chromium driven through Selenium and Debian's chromedriver (never a downloaded
browser). Screenshots go to ``artifacts/django-browser/`` (``ANARCHON_ARTIFACTS`` moves
the folder). Also ``nox -s browser``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from tests.django.conftest import Store
from tests.stores import unavailable

pytestmark = [pytest.mark.browser, pytest.mark.timeout(120),
              pytest.mark.django_db(transaction=True, databases=["default", "pg"])]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
ARTIFACTS = Path(os.environ.get("ANARCHON_ARTIFACTS")
                 or Path(__file__).resolve().parents[2] / "artifacts") / "django-browser"


@pytest.fixture
def browser() -> Iterator[Any]:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(path):
            unavailable("Chromium", f"{path} is missing (apt-get install chromium "
                        "chromium-driver)")
    try:
        from selenium import webdriver  # noqa: PLC0415
        from selenium.webdriver.chrome.service import Service  # noqa: PLC0415
    except ImportError as exc:
        unavailable("Selenium", str(exc))
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage", "--window-size=1400,900"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def sqlite_store(settings: Any, anarchon_reset: None) -> Iterator[Store]:
    from tests.django.conftest import _use  # noqa: PLC0415

    yield from _use("sqlite", settings)


@pytest.fixture
def _forget_jobs() -> Iterator[None]:
    from anarchon_django import registry  # noqa: PLC0415

    yield
    registry.forget("testapp.every-2s")


@pytest.mark.usefixtures("_forget_jobs")
def test_history_filter_and_run_now(browser: Any, live_server: Any, sqlite_store: Store
                                    ) -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415
    from selenium.webdriver.support import expected_conditions as ec  # noqa: PLC0415
    from selenium.webdriver.support.select import Select  # noqa: PLC0415
    from selenium.webdriver.support.wait import WebDriverWait  # noqa: PLC0415

    import anarchon_django  # noqa: PLC0415

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    scheduler = anarchon_django.get_scheduler()
    for name in ("testapp.fail", "testapp.async_note"):  # some history to filter
        scheduler.sync.run_now(name, timeout=30)
    # A job with recent scheduled slots for the timeline: slots claimed too late are
    # recorded skipped, one is never claimed (missed), some fail.
    anarchon_django.every("testapp.every-2s", "2s", lambda ctx: None, max_late_ms=16_000)
    now = round(time.time() * 1000)
    for index, slot in enumerate(range(now - now % 2000 - 40_000, now - 4_000, 2_000)):
        if index == 5:
            continue
        claim = scheduler.sync.claim("testapp.every-2s", slot)
        if claim:
            claim.finish("failed" if index % 5 == 3 else "success",
                         error="upstream timed out" if index % 5 == 3 else None)
    wait = WebDriverWait(browser, 20)

    browser.get(f"{live_server.url}/admin/login/?next=/admin/anarchon_django/run/")
    browser.find_element(By.ID, "id_username").send_keys("admin")
    browser.find_element(By.ID, "id_password").send_keys("correct horse")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait.until(ec.presence_of_element_located((By.ID, "anarchon-filters")))
    assert "Run history" in browser.title
    jobs = {row.get_attribute("data-job") for row in
            browser.find_elements(By.CSS_SELECTOR, "tr.anarchon-run")}
    assert jobs == {"testapp.async_note", "testapp.fail", "testapp.every-2s"}
    browser.save_screenshot(str(ARTIFACTS / "1-history.png"))

    Select(browser.find_element(By.ID, "id_job")).select_by_value("testapp.note")
    browser.find_element(By.ID, "anarchon-filter-submit").click()
    wait.until(ec.url_contains("job=testapp.note"))
    assert browser.find_elements(By.CSS_SELECTOR, "tr.anarchon-run") == []
    browser.save_screenshot(str(ARTIFACTS / "2-filtered.png"))

    browser.find_element(By.ID, "anarchon-run-now").click()
    message = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR,
                                                         ".messagelist li.success")))
    assert "Manual run of 'testapp.note' succeeded in" in message.text
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.anarchon-run")
    assert [(r.get_attribute("data-job"), r.get_attribute("data-status")) for r in rows] \
        == [("testapp.note", "success")]
    assert "manual" in rows[0].text
    assert "requested_by=admin" in rows[0].text
    browser.save_screenshot(str(ARTIFACTS / "3-run-now.png"))

    browser.get(f"{live_server.url}/admin/anarchon_django/job/")
    wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "tr.anarchon-job")))
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-job="testapp.fail"]')
    assert "manual: failed" in row.text
    cells = browser.find_elements(By.CSS_SELECTOR,
                                  'tr[data-job="testapp.every-2s"] .anarchon-timeline span')
    states = {c.get_attribute("data-state") for c in cells}
    assert {"success", "failed", "missed", "skipped"} <= states, states
    browser.save_screenshot(str(ARTIFACTS / "4-jobs.png"))
    assert all((ARTIFACTS / f).stat().st_size > 10_000 for f in
               ("1-history.png", "2-filtered.png", "3-run-now.png", "4-jobs.png"))
