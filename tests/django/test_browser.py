"""The admin in a real browser at 1280 px: history, filter, run now, pause, the live workers.

Debian's Chromium driven through Selenium and Debian's chromedriver (never a downloaded
browser). Each anarchon page's breadcrumbs are compared with a stock admin page's (the
auth Group list): same element, classes, structure and computed style, in light and dark
themes, on whichever Django is installed (5.2 and 6.x render different markup). Screenshots
go to ``artifacts/django-browser/`` (``ANARCHON_ARTIFACTS`` moves the folder), named with
the Django version. Also ``nox -s browser``.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import django
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
VERSION = f"django{django.VERSION[0]}.{django.VERSION[1]}"
WIDTH = 1280
STOCK = "/admin/auth/group/"
JOBS = "/admin/anarchon_django/job/"
HISTORY = "/admin/anarchon_django/run/"

# The breadcrumbs as a page renders them: the element, its children, and the computed
# style of each part (texts left out but the translated "Home").
_CRUMBS = """
const el = document.querySelector('.breadcrumbs');
if (!el) return null;
const props = ['color', 'background-color', 'font-size', 'font-family', 'font-weight',
  'line-height', 'padding-top', 'padding-left', 'margin-top', 'margin-bottom',
  'border-bottom-width', 'display', 'list-style-type', 'text-align'];
const style = (node, pseudo) => {
  const s = getComputedStyle(node, pseudo || null);
  return Object.fromEntries(props.concat(['content']).map(p => [p, s.getPropertyValue(p)]));
};
const items = Array.from(el.children);
return {
  tag: el.tagName, classes: el.className, parent: el.parentElement.tagName,
  parentLabel: el.parentElement.getAttribute('aria-label') !== null,
  children: items.map(c => c.tagName + (c.getAttribute('aria-current') ? '[current]' : '')),
  style: style(el), items: items.map(c => [style(c), style(c, '::before'), style(c, '::after')]),
  link: style(el.querySelector('a')), home: el.querySelector('a').textContent.trim(),
  height: Math.round(el.getBoundingClientRect().height),
};
"""

# Elements of the page's content whose own background is bright (dark mode must have none).
_BRIGHT = """
const out = [];
for (const node of document.querySelectorAll('#content *')) {
  const m = getComputedStyle(node).backgroundColor.match(/[\\d.]+/g);
  if (!m || (m.length > 3 && Number(m[3]) === 0)) continue;
  const [r, g, b] = m.slice(0, 3).map(Number);
  if (0.2126 * r + 0.7152 * g + 0.0722 * b > 150) {
    out.push(node.tagName + '.' + node.className + ' ' + getComputedStyle(node).backgroundColor);
  }
}
return out;
"""

# Whether the page fits the window, and every "Run now" button is inside the table's view.
_FITS = """
const results = document.querySelector('#changelist .results');
const box = results.getBoundingClientRect();
const cut = Array.from(document.querySelectorAll('input[value="Run now"]')).filter(b => {
  const r = b.getBoundingClientRect();
  return r.width === 0 || r.right > box.right + 0.5 || r.right > window.innerWidth;
}).length;
return {page: document.documentElement.scrollWidth, window: window.innerWidth,
        table: results.scrollWidth, box: results.clientWidth, cut: cut,
        buttons: document.querySelectorAll('input[value="Run now"]').length};
"""


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
                 "--disable-sync", "--disable-dev-shm-usage", "--hide-scrollbars"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        driver.set_window_size(WIDTH, 900)
        # The window's outer size includes no chrome when headless; make the page 1280 wide.
        inner = driver.execute_script("return window.innerWidth")
        if inner != WIDTH:
            driver.set_window_size(2 * WIDTH - inner, 900)
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


def shot(browser: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{VERSION}-{name}.png"
    browser.save_screenshot(str(path))
    return path


def log_in(browser: Any, live_server: Any, then: str) -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415
    from selenium.webdriver.support import expected_conditions as ec  # noqa: PLC0415
    from selenium.webdriver.support.wait import WebDriverWait  # noqa: PLC0415

    User.objects.create_superuser("admin", "admin@example.com", "correct horse")
    browser.get(f"{live_server.url}/admin/login/?next={then}")
    browser.find_element(By.ID, "id_username").send_keys("admin")
    browser.find_element(By.ID, "id_password").send_keys("correct horse")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    WebDriverWait(browser, 20).until(ec.url_contains(then))


def wait_for(browser: Any, selector: str) -> Any:
    from selenium.webdriver.common.by import By  # noqa: PLC0415
    from selenium.webdriver.support import expected_conditions as ec  # noqa: PLC0415
    from selenium.webdriver.support.wait import WebDriverWait  # noqa: PLC0415

    return WebDriverWait(browser, 20).until(ec.presence_of_element_located((By.CSS_SELECTOR,
                                                                            selector)))


def open_page(browser: Any, url: str, selector: str) -> None:
    browser.get(url)
    wait_for(browser, selector)


def recent_slots() -> None:
    """A job with recent scheduled slots: some succeed, some fail, one is never claimed."""
    import anarchon_django  # noqa: PLC0415

    scheduler = anarchon_django.get_scheduler()
    anarchon_django.every("testapp.every-2s", "2s", lambda ctx: None, max_late_ms=16_000)
    now = round(time.time() * 1000)
    for index, slot in enumerate(range(now - now % 2000 - 40_000, now - 4_000, 2_000)):
        if index == 5:
            continue
        claim = scheduler.sync.claim("testapp.every-2s", slot)
        if claim:
            claim.finish("failed" if index % 5 == 3 else "success",
                         error="upstream timed out" if index % 5 == 3 else None)


@pytest.mark.usefixtures("_forget_jobs")
def test_history_filter_and_run_now(browser: Any, live_server: Any, sqlite_store: Store
                                    ) -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415
    from selenium.webdriver.support import expected_conditions as ec  # noqa: PLC0415
    from selenium.webdriver.support.select import Select  # noqa: PLC0415
    from selenium.webdriver.support.wait import WebDriverWait  # noqa: PLC0415

    import anarchon_django  # noqa: PLC0415

    scheduler = anarchon_django.get_scheduler()
    for name in ("testapp.fail", "testapp.async_note"):  # some history to filter
        scheduler.sync.run_now(name, timeout=30)
    recent_slots()
    wait = WebDriverWait(browser, 20)

    log_in(browser, live_server, HISTORY)
    wait.until(ec.presence_of_element_located((By.ID, "anarchon-filters")))
    assert "Run history" in browser.title
    jobs = {row.get_attribute("data-job") for row in
            browser.find_elements(By.CSS_SELECTOR, "tr.anarchon-run")}
    assert jobs == {"testapp.async_note", "testapp.fail", "testapp.every-2s"}
    shot(browser, "1-history")

    Select(browser.find_element(By.ID, "id_job")).select_by_value("testapp.note")
    browser.find_element(By.ID, "anarchon-filter-submit").click()
    wait.until(ec.url_contains("job=testapp.note"))
    assert browser.find_elements(By.CSS_SELECTOR, "tr.anarchon-run") == []

    browser.find_element(By.ID, "anarchon-run-now").click()
    message = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR,
                                                         ".messagelist li.success")))
    assert "Manual run of 'testapp.note' succeeded in" in message.text
    rows = browser.find_elements(By.CSS_SELECTOR, "tr.anarchon-run")
    assert [(r.get_attribute("data-job"), r.get_attribute("data-status")) for r in rows] \
        == [("testapp.note", "success")]
    assert "manual" in rows[0].text
    assert "requested_by=admin" in rows[0].text
    shot(browser, "2-run-now")

    open_page(browser, f"{live_server.url}{JOBS}", "tr.anarchon-job")
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-job="testapp.fail"]')
    assert "manual: failed" in row.text
    cells = browser.find_elements(By.CSS_SELECTOR,
                                  'tr[data-job="testapp.every-2s"] .anarchon-timeline span')
    states = {c.get_attribute("data-state") for c in cells}
    assert {"success", "failed", "missed", "skipped"} <= states, states
    fits = browser.execute_script(_FITS)
    assert fits["buttons"] >= 6, fits
    assert fits["page"] <= fits["window"] == WIDTH, fits
    assert fits["table"] <= fits["box"], fits
    assert fits["cut"] == 0, fits
    path = shot(browser, "3-jobs")
    assert path.stat().st_size > 10_000


@pytest.mark.usefixtures("_forget_jobs")
def test_live_workers_and_pause_resume(browser: Any, live_server: Any,
                                       sqlite_store: Store) -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    from anarchon_core import __version__  # noqa: PLC0415
    from anarchon_django import runtime  # noqa: PLC0415

    recent_slots()
    claimed = time.time()
    log_in(browser, live_server, JOBS)
    # A 2 s slot after the last claim: due since the fleet's last sign of life, unrun.
    time.sleep(max(0.0, claimed + 2.2 - time.time()))
    open_page(browser, f"{live_server.url}{JOBS}", "#anarchon-fleet")
    warning = browser.find_element(By.ID, "anarchon-no-worker")
    assert "No worker is alive" in warning.text
    row = browser.find_element(By.CSS_SELECTOR, 'tr[data-job="testapp.report"]')
    assert "none: no worker alive" in row.text
    states = [c.get_attribute("data-state") for c in browser.find_elements(
        By.CSS_SELECTOR, 'tr[data-job="testapp.every-2s"] .anarchon-timeline span')]
    assert "no-worker" in states, states
    assert "pending" not in states, states
    shot(browser, "4-no-worker")

    worker = runtime.build_scheduler()
    worker.sync.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(  # its first record follows start()
                i.instance_id == worker.instance_id for i in worker.sync.status().instances):
            time.sleep(0.1)
        open_page(browser, f"{live_server.url}{JOBS}", "#anarchon-fleet")
        listed = browser.find_element(
            By.CSS_SELECTOR, f'.anarchon-worker[data-instance="{worker.instance_id}"]')
        assert f"version {__version__}" in listed.text
        assert "last seen" in listed.text
        assert browser.find_elements(By.ID, "anarchon-no-worker") == []
        row = browser.find_element(By.CSS_SELECTOR, 'tr[data-job="testapp.report"]')
        assert "no worker" not in row.text
        assert " 08:00:00" in row.text

        row.find_element(By.CSS_SELECTOR, 'input[value="Pause"]').click()
        assert "Paused 'testapp.report' for every worker" in wait_for(
            browser, ".messagelist li.success").text
        row = browser.find_element(By.CSS_SELECTOR, 'tr[data-job="testapp.report"]')
        assert "paused" in row.text
        assert "testapp.report" in worker.sync.paused()
        shot(browser, "5-workers-paused")
        row.find_element(By.CSS_SELECTOR, 'input[value="Resume"]').click()
        assert "Resumed 'testapp.report'" in wait_for(browser, ".messagelist li.success").text
        assert "testapp.report" not in worker.sync.paused()
    finally:
        worker.sync.stop(0)


@pytest.mark.parametrize(("theme", "language"), [("light", "en-us"), ("dark", "fr")])
@pytest.mark.usefixtures("_forget_jobs")
def test_pages_look_like_the_stock_admin(browser: Any, live_server: Any, sqlite_store: Store,
                                         settings: Any, theme: str, language: str) -> None:
    """Breadcrumbs as the stock Group list renders them; no bright cells in dark mode."""
    settings.LANGUAGE_CODE = language
    recent_slots()
    import anarchon_django  # noqa: PLC0415

    anarchon_django.get_scheduler().sync.run_now("testapp.fail", timeout=30)
    log_in(browser, live_server, STOCK)
    browser.execute_script("localStorage.setItem('theme', arguments[0])", theme)
    open_page(browser, f"{live_server.url}{STOCK}", ".breadcrumbs")
    assert browser.execute_script("return document.documentElement.dataset.theme") == theme
    stock = browser.execute_script(_CRUMBS)
    assert stock is not None
    stock_bright = browser.execute_script(_BRIGHT)
    shot(browser, f"stock-{theme}")
    if django.VERSION >= (6, 1):  # 6.1 made them a list; 6.0 keeps 5.2's <div>
        assert (stock["tag"], stock["children"][0]) == ("OL", "LI")
    else:
        assert stock["tag"] == "DIV"
    for page, name in ((JOBS, "jobs"), (HISTORY, "history")):
        open_page(browser, f"{live_server.url}{page}", "#result_list")
        ours = browser.execute_script(_CRUMBS)
        assert ours == stock, (name, ours, stock)
        if theme == "dark":
            assert browser.execute_script(_BRIGHT) == stock_bright == [], name
        shot(browser, f"{name}-{theme}")
    if language == "fr":
        assert stock["home"] == "Accueil"
