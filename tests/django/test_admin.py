"""The admin pages: job table, run history, run now; permissions and CSRF; every backend."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from html import unescape
from typing import Any

import django
import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import NoReverseMatch, reverse

import anarchon_core
import anarchon_django
from anarchon_core import JobContext, Run, StoreNotSetUp, slot_from_datetime
from anarchon_django import fleet, registry, views
from anarchon_django.registry import Declaration
from tests.django.conftest import Store, namespace_exists, typo

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])
HISTORY = "/admin/anarchon_django/run/"
JOBS = "/admin/anarchon_django/job/"
RUN = "/admin/anarchon_django/job/run/"


def user(name: str, *, staff: bool, perms: tuple[str, ...] = (),
         superuser: bool = False) -> User:
    account = User.objects.create_user(name, password="pw", is_staff=staff,
                                       is_superuser=superuser)
    for codename in perms:
        account.user_permissions.add(Permission.objects.get(
            content_type__app_label="anarchon_django", codename=codename))
    return account


def client_for(account: User | None, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    if account is not None:
        client.force_login(account)
    return client


@pytest.fixture
def admin_client_() -> Client:
    return client_for(user("boss", staff=True, superuser=True))


def csrf_token(html: str) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert match, "no CSRF token in the form"
    return match.group(1)


def rows(html: str) -> list[dict[str, str]]:
    return [{"job": unescape(m.group(1)), "status": m.group(2), "html": m.group(0)}
            for m in re.finditer(r'<tr class="anarchon-run[^"]*" data-job="([^"]*)" '
                                 r'data-status="([^"]*)">.*?</tr>', html, re.S)]


def history_of(job: str) -> list[Run]:
    """The job's history; empty when nothing was ever written to the store."""
    try:
        page = views.history_page(anarchon_django.get_reader(), job=job, status=None,
                                  runner=None, search=None, limit=50, before=None)
    except StoreNotSetUp:
        return []
    return page.runs


def run_jobs(*names: str) -> list[Run]:
    scheduler = anarchon_django.get_scheduler()
    return [scheduler.sync.run_now(name, timeout=30) for name in names]


# ------------------------------------------------------------------ pages and permissions


def test_index_lists_both_entries_without_add_links(store: Store,
                                                    admin_client_: Client) -> None:
    html = admin_client_.get("/admin/").content.decode()
    assert "Scheduled jobs" in html
    assert f'href="{JOBS}"' in html
    assert f'href="{HISTORY}"' in html
    assert "/admin/anarchon_django/run/add/" not in html
    assert "/admin/anarchon_django/job/add/" not in html
    for name in ("add", "change", "delete", "history"):
        with pytest.raises(NoReverseMatch):
            reverse(f"admin:anarchon_django_run_{name}", args=["1"] if name != "add" else [])
    assert admin_client_.get(f"{HISTORY}add/").status_code == 404


def test_history_page_shows_each_attempt(store: Store, admin_client_: Client) -> None:
    run_jobs("testapp.note", "testapp.fail")
    response = admin_client_.get(HISTORY)
    assert response.status_code == 200
    html = response.content.decode()
    found = rows(html)
    assert [(r["job"], r["status"]) for r in found] == [("testapp.fail", "failed"),
                                                          ("testapp.note", "success")]
    assert "RuntimeError: the report server said no" in found[0]["html"]
    assert "<strong>manual</strong>" in found[1]["html"]
    assert "notes=" in found[1]["html"]  # meta
    assert re.search(r"\d+ ms</td>", found[1]["html"])  # duration
    assert anarchon_django.get_scheduler().instance_id in found[1]["html"]
    assert "Europe/Athens" in html


def test_history_filters_and_search(store: Store, admin_client_: Client) -> None:
    run_jobs("testapp.note", "testapp.fail", "testapp.note")
    runner = anarchon_django.get_scheduler().instance_id

    def jobs(query: str) -> list[str]:
        return [r["job"] for r in rows(admin_client_.get(HISTORY + query).content.decode())]

    assert jobs("?job=testapp.note") == ["testapp.note", "testapp.note"]
    assert jobs("?status=failed") == ["testapp.fail"]
    assert jobs("?status=success&job=testapp.fail") == []
    assert len(jobs(f"?runner={runner}")) == 3
    assert jobs("?runner=elsewhere") == []
    assert jobs("?q=REPORT+SERVER") == ["testapp.fail"]  # error text, case-insensitive
    assert jobs("?q=notes") == ["testapp.note", "testapp.note"]  # a meta key
    assert jobs("?q=nothing-like-this") == []
    # The job filter lists the jobs declared here and those the store holds.
    html = admin_client_.get(HISTORY).content.decode()
    assert '<option value="testapp.report">' in html


def test_history_pages_through_the_cursor(store: Store, admin_client_: Client) -> None:
    made = run_jobs(*["testapp.note"] * 21)
    seen: list[str] = []
    sizes: list[int] = []
    url: str | None = f"{HISTORY}?n=20"
    while url is not None and len(sizes) < 10:
        html = admin_client_.get(url).content.decode()
        seen += [r["html"] for r in rows(html)]
        sizes.append(len(rows(html)))
        match = re.search(r'<a href="([^"]+)" id="anarchon-older">', html)
        url = HISTORY + unescape(match.group(1)) if match else None
    assert sizes == [20, 1]
    assert len(seen) == len(made) == len(set(seen))
    # A search pages the same way.
    html = admin_client_.get(f"{HISTORY}?n=20&q=testapp.note").content.decode()
    assert len(rows(html)) == 20
    assert 'id="anarchon-older"' in html


@pytest.mark.parametrize(("n", "size"), [("1", 20), ("2", 20), ("0", 20), ("-5", 20),
                                         ("100", 100), ("100000", 200), ("abc", 50)])
def test_page_size_is_kept_within_20_to_200(n: str, size: int) -> None:
    assert views.page_size(n) == size


def test_a_page_smaller_than_20_is_not_served(db_store: Store, admin_client_: Client) -> None:
    run_jobs(*["testapp.note"] * 21)
    html = admin_client_.get(f"{HISTORY}?n=1").content.decode()
    assert len(rows(html)) == 20
    assert '<option value="20" selected>' in html
    assert 'id="anarchon-older"' in html


def test_a_bad_cursor_shows_the_newest_runs_and_says_so(store: Store,
                                                         admin_client_: Client) -> None:
    run_jobs("testapp.note")
    for cursor in ("garbage", "r1.bm90LWpzb24"):
        response = admin_client_.get(f"{HISTORY}?before={cursor}")
        assert response.status_code == 200
        html = unescape(response.content.decode())
        assert f"The page link's position ({cursor!r}) is not one this page made; " \
            "showing the newest runs instead." in html
        assert [r["job"] for r in rows(html)] == ["testapp.note"]


def test_jobs_page(store: Store, admin_client_: Client) -> None:
    run_jobs("testapp.fail")
    html = admin_client_.get(JOBS).content.decode()
    job_rows = dict(re.findall(r'<tr class="anarchon-job" data-job="([^"]+)">(.*?)</tr>',
                               html, re.S))
    assert set(job_rows) >= {"testapp.note", "testapp.report", "testapp.fail"}
    assert "cron 0 8 * * * Europe/Athens" in job_rows["testapp.report"]
    assert " 08:00:00" in job_rows["testapp.report"]  # the next run, in TIME_ZONE
    assert "never" in job_rows["testapp.note"]
    assert "manual: failed" in job_rows["testapp.fail"]
    assert job_rows["testapp.note"].count('value="Run now"') == 1
    assert job_rows["testapp.note"].count('class="st-') == views.TIMELINE_SLOTS


@pytest.mark.parametrize("page", [HISTORY, JOBS])
def test_a_page_over_a_namespace_with_no_store_says_so_and_creates_nothing(
        store: Store, settings: Any, admin_client_: Client, page: str) -> None:
    key, name = typo(store)
    settings.ANARCHON = {**store.anarchon, key: name}
    response = admin_client_.get(page)
    assert response.status_code == 200
    html = unescape(response.content.decode())
    errors = re.findall(r'<li class="error">(.*?)</li>', html, re.S)
    assert len(errors) == 1, errors
    assert errors[0].startswith("no anarchon store in ")
    assert name in errors[0]
    assert "ANARCHON's TABLE or PREFIX names it" in errors[0]
    assert not namespace_exists(store, name)


def test_timeline_colours_scheduled_slots(db_store: Store, admin_client_: Client) -> None:
    """Real claims of recent slots show in the timeline with their status."""
    name = f"testapp.fast-{uuid.uuid4().hex[:6]}"

    def handler(ctx: JobContext) -> None:
        pass

    anarchon_django.every(name, "1s", handler, max_late_ms=60_000, jitter_ms=0)
    try:
        scheduler = anarchon_django.get_scheduler()
        now = slot_from_datetime(__import__("datetime").datetime.now(
            __import__("datetime").timezone.utc))
        base = now - now % 1000 - 10_000
        outcomes = {base: "success", base + 1000: "failed", base + 3000: "success"}
        for slot, status in outcomes.items():
            claim = scheduler.sync.claim(name, slot)
            assert claim, claim
            claim.finish(status=status, error="boom" if status == "failed" else None)
        html = admin_client_.get(JOBS).content.decode()
    finally:
        registry.forget(name)
    row = re.search(rf'data-job="{re.escape(name)}">(.*?)</tr>', html, re.S)
    assert row
    cells = re.findall(r'title="([^"]*)" data-state="([\w-]+)"', row.group(1))
    states = [state for _, state in cells]
    assert len(states) == views.TIMELINE_SLOTS
    # ...unknown (before the oldest run kept), success, failed, a gap still claimable
    # (max_late_ms is 60 s here) but by no one: no worker is alive, success, then the
    # slots up to now, for which there is no worker either.
    first = states.index("success")
    assert set(states[:first]) <= {"unknown", "no-worker"}
    assert states[first:first + 4] == ["success", "failed", "no-worker", "success"]
    assert "boom" in unescape(cells[first + 1][0])


def test_timeline_rules() -> None:
    """Pure logic: missed, pending, unknown, and the newest attempt wins."""

    def handler(ctx: JobContext) -> None:
        pass

    declaration = Declaration("t", "every", "10s", handler)
    now = 1_000_000_000_000 + 105_000
    base = 1_000_000_000_000

    def run(slot: int, status: str, attempt: int = 1, manual: bool = False) -> Run:
        return Run("t", slot, attempt, status, "a:1", None, manual=manual)

    runs = [run(base + 100_000, "success"), run(base + 90_000, "success"),
            run(base + 90_000, "interrupted"), run(base + 60_000, "failed", attempt=2),
            run(base + 60_000, "interrupted"), run(base + 40_000, "skipped"),
            run(base + 55_000, "success", manual=True)]
    runs.sort(key=lambda r: (r.slot, r.attempt), reverse=True)
    cells = views._timeline(declaration, runs, {"max_late_ms": 8_000, "jitter_ms": 1_000},
                            now)
    by_slot = {c.slot - base: c.state for c in cells}
    assert by_slot[100_000] == "success"
    assert by_slot[90_000] == "success"  # the newest attempt decides
    assert by_slot[80_000] == "missed"
    assert by_slot[70_000] == "missed"
    assert by_slot[60_000] == "failed"
    assert by_slot[50_000] == "missed"  # the manual run does not fill a slot
    assert by_slot[40_000] == "skipped"
    assert by_slot[30_000] == "unknown"  # older than the oldest run kept
    assert cells[-1].slot == base + 100_000
    late = views._timeline(declaration, runs, {"max_late_ms": 8_000}, base + 108_000)
    assert late[-1].slot == base + 100_000
    assert late[-1].state == "success"
    fresh = views._timeline(declaration, runs, {"max_late_ms": 8_000}, base + 111_000)
    assert fresh[-1].state == "pending"  # slot 110 s: may still be claimed


@pytest.mark.parametrize("page", [HISTORY, JOBS])
def test_anonymous_and_non_staff_are_sent_to_login(store: Store, page: str) -> None:
    for account in (None, user("customer", staff=False)):
        response = client_for(account).get(page)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")
    response = client_for(None).post(RUN, {"job": "testapp.note"})
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


@pytest.mark.parametrize("page", [HISTORY, JOBS])
def test_staff_without_permission_is_refused(store: Store, page: str) -> None:
    assert client_for(user("intern", staff=True)).get(page).status_code == 403


def test_view_permission_alone_shows_pages_without_run_now(store: Store) -> None:
    viewer = client_for(user("viewer", staff=True, perms=("view_run", "view_job")))
    assert viewer.get(HISTORY).status_code == 200
    html = viewer.get(JOBS).content.decode()
    assert 'value="Run now"' not in html
    assert 'id="anarchon-run-now"' not in viewer.get(f"{HISTORY}?job=testapp.note"
                                                      ).content.decode()


# ------------------------------------------------------------------ run now


def test_run_now_with_permission_and_csrf(store: Store) -> None:
    operator = user("operator", staff=True, perms=("view_run", "view_job", "run_job"))
    client = client_for(operator, csrf=True)
    page = client.get(f"{HISTORY}?job=testapp.note").content.decode()
    assert 'id="anarchon-run-now"' in page
    response = client.post(RUN, {"job": "testapp.note", "csrfmiddlewaretoken":
                                 csrf_token(page), "next": f"{HISTORY}?job=testapp.note"})
    assert response.status_code == 302
    assert response["Location"] == f"{HISTORY}?job=testapp.note"
    html = client.get(response["Location"]).content.decode()
    assert "Manual run of &#x27;testapp.note&#x27; succeeded in" in html
    [run] = anarchon_django.get_reader().sync.history("testapp.note")
    assert run.manual
    assert run.status == "success"
    assert run.meta["requested_by"] == "operator"
    assert rows(html)[0]["job"] == "testapp.note"
    assert "<strong>manual</strong>" in html


def test_run_now_is_refused_without_csrf_or_permission(store: Store) -> None:
    operator = user("operator", staff=True, perms=("view_run", "view_job", "run_job"))
    assert client_for(operator, csrf=True).post(RUN, {"job": "testapp.note"}
                                                ).status_code == 403
    viewer = user("viewer", staff=True, perms=("view_run", "view_job"))
    client = client_for(viewer, csrf=True)
    token = csrf_token(client.get(HISTORY).content.decode())
    assert client.post(RUN, {"job": "testapp.note", "csrfmiddlewaretoken": token}
                       ).status_code == 403
    assert client_for(operator).get(RUN).status_code == 405
    assert history_of("testapp.note") == []


def test_run_now_of_an_unknown_job_or_a_failing_one(store: Store,
                                                    admin_client_: Client) -> None:
    response = admin_client_.post(RUN, {"job": "nope"}, follow=True)
    assert "No job named &#x27;nope&#x27; is declared" in response.content.decode()
    response = admin_client_.post(RUN, {"job": "testapp.fail"}, follow=True)
    html = response.content.decode()
    assert ("Manual run of &#x27;testapp.fail&#x27; ended failed: RuntimeError: the report "
            "server said no") in html
    response = admin_client_.post(RUN, {"job": "testapp.note",
                                        "next": "https://evil.example/"})
    assert response["Location"] == HISTORY  # an outside URL is never followed


def test_a_long_run_now_continues_in_the_background(db_store: Store, settings: Any,
                                                    admin_client_: Client) -> None:
    settings.ANARCHON = {**db_store.anarchon, "ADMIN_RUN_NOW_WAIT_MS": 200}
    name = f"testapp.slow-{uuid.uuid4().hex[:6]}"

    def slow(ctx: JobContext) -> None:
        time.sleep(1.5)

    anarchon_django.every(name, "1h", slow)
    try:
        response = admin_client_.post(RUN, {"job": name}, follow=True)
        assert (f"Manual run of &#x27;{name}&#x27; is running now in this process"
                in response.content.decode())
        html = admin_client_.get(f"{HISTORY}?job={name}").content.decode()
        assert [r["status"] for r in rows(html)] == ["running"]
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            found = list(anarchon_django.get_reader().sync.history(name))
            if found and found[0].status == "success":
                break
            time.sleep(0.1)
        assert found[0].status == "success"
    finally:
        registry.forget(name)


@pytest.fixture(autouse=True)
def _no_leftover_jobs() -> Iterator[None]:
    before = {d.name for d in registry.declarations()}
    yield
    for name in {d.name for d in registry.declarations()} - before:
        registry.forget(name)


def test_run_now_messages_keep_the_job_name_as_declared(db_store: Store,
                                                         admin_client_: Client) -> None:
    name = f"tick-{uuid.uuid4().hex[:6]}"
    anarchon_django.every(name, "1h", lambda ctx: None)
    response = admin_client_.post(RUN, {"job": name}, follow=True)
    html = unescape(response.content.decode())
    assert f"Manual run of '{name}' succeeded in" in html
    assert f"{name.capitalize()}:" not in html


# ------------------------------------------------------------------ Django's own look

def breadcrumbs(html: str) -> tuple[str, list[str]]:
    """The breadcrumbs' element and its items, as the page renders them."""
    match = re.search(r'<(ol|div) class="breadcrumbs">(.*?)</\1>', html, re.S)
    assert match, "no breadcrumbs"
    body = match.group(2)
    items = (re.findall(r"<li[^>]*>(.*?)</li>", body, re.S) if match.group(1) == "ol"
             else [part.strip() for part in body.split("&rsaquo;")])
    return match.group(1), [" ".join(item.split()) for item in items]


def test_breadcrumbs_are_the_admins_own_in_its_language(db_store: Store, settings: Any,
                                                        admin_client_: Client) -> None:
    settings.LANGUAGE_CODE = "fr"
    tag, stock = breadcrumbs(admin_client_.get("/admin/auth/group/").content.decode())
    assert tag == ("ol" if django.VERSION >= (6, 1) else "div")  # a list since 6.1
    assert stock[0] == '<a href="/admin/">Accueil</a>'
    for page, last in ((JOBS, "Jobs"), (HISTORY, "Run history")):
        html = admin_client_.get(page).content.decode()
        assert breadcrumbs(html) == (tag, [
            stock[0], '<a href="/admin/anarchon_django/">Scheduled jobs</a>', last])
        assert "admin/css/changelists.css" in html
        assert "anarchon_django/admin.css" in html


# ------------------------------------------------------------------ the fleet, pause, resume

PAUSE = "/admin/anarchon_django/job/pause/"
RESUME = "/admin/anarchon_django/job/resume/"


def job_row(html: str, job: str) -> str:
    match = re.search(rf'<tr class="anarchon-job" data-job="{re.escape(job)}">(.*?)</tr>',
                      html, re.S)
    assert match, f"no row for {job}"
    return match.group(1)


def test_the_jobs_page_names_the_live_workers(store: Store, admin_client_: Client) -> None:
    html = admin_client_.get(JOBS).content.decode()
    assert 'id="anarchon-no-worker"' in html
    assert "none: no worker alive" in job_row(html, "testapp.report")
    worker = anarchon_django.build_scheduler()
    worker.sync.start()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # its first registry record follows start()
            html = admin_client_.get(JOBS).content.decode()
            if f'data-instance="{worker.instance_id}"' in html:
                break
            time.sleep(0.1)
        banner = re.search(r'<div class="anarchon-fleet".*?</ul>', html, re.S)
        assert banner, html
        assert f'data-instance="{worker.instance_id}"' in banner.group(0)
        assert f"version {anarchon_core.__version__}" in banner.group(0)
        assert "1 worker alive" in banner.group(0)
        assert "last seen " in banner.group(0)
        assert 'id="anarchon-no-worker"' not in html
        assert "none: no worker alive" not in job_row(html, "testapp.report")
    finally:
        worker.sync.stop(0)
    html = admin_client_.get(JOBS).content.decode()  # stop() deleted its record
    assert 'id="anarchon-no-worker"' in html


def test_pause_and_resume_for_every_worker(store: Store) -> None:
    pauser = user("pauser", staff=True, perms=("view_run", "view_job", "pause_job"))
    client = client_for(pauser, csrf=True)
    page = client.get(JOBS).content.decode()
    row = job_row(page, "testapp.note")
    assert 'value="Pause"' in row
    assert 'value="Run now"' not in row  # pausing is not running
    response = client.post(PAUSE, {"job": "testapp.note",
                                   "csrfmiddlewaretoken": csrf_token(page)})
    assert response.status_code == 302
    assert response["Location"] == JOBS
    paused = anarchon_django.get_reader().sync.paused()
    assert set(paused) == {"testapp.note"}
    assert paused["testapp.note"].reason == "paused by pauser in the admin"
    html = unescape(client.get(JOBS).content.decode())
    assert "Paused 'testapp.note' for every worker" in html
    row = job_row(html, "testapp.note")
    assert '<span class="anarchon-paused">paused</span>' in row
    assert 'value="Resume"' in row
    token = csrf_token(html)
    response = client.post(RESUME, {"job": "testapp.note", "csrfmiddlewaretoken": token,
                                    "next": f"{JOBS}?from=here"})
    assert response["Location"] == f"{JOBS}?from=here"
    assert anarchon_django.get_reader().sync.paused() == {}
    assert "Resumed 'testapp.note' for every worker" in unescape(
        client.get(JOBS).content.decode())
    client.post(RESUME, {"job": "testapp.note", "csrfmiddlewaretoken": token})
    assert "Nothing to resume: 'testapp.note' was not paused." in unescape(
        client.get(JOBS).content.decode())
    response = client.post(PAUSE, {"job": "testapp.note", "csrfmiddlewaretoken": token,
                                   "next": "https://evil.example/"})
    assert response["Location"] == JOBS  # an outside URL is never followed


def test_pause_needs_its_permission_csrf_and_post(store: Store) -> None:
    operator = user("operator", staff=True, perms=("view_run", "view_job", "run_job"))
    client = client_for(operator, csrf=True)
    page = client.get(JOBS).content.decode()
    assert 'value="Pause"' not in page
    for url in (PAUSE, RESUME):
        assert client.post(url, {"job": "testapp.note", "csrfmiddlewaretoken":
                                 csrf_token(page)}).status_code == 403
    pauser = user("pauser", staff=True, perms=("view_job", "pause_job"))
    assert client_for(pauser, csrf=True).post(PAUSE, {"job": "testapp.note"}
                                              ).status_code == 403
    assert client_for(pauser).get(PAUSE).status_code == 405
    response = client_for(None).post(PAUSE, {"job": "testapp.note"})
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    paused = anarchon_django.get_scheduler().sync.paused()
    assert paused == {}


def test_a_job_paused_elsewhere_has_a_row_to_resume_it(db_store: Store,
                                                       admin_client_: Client) -> None:
    anarchon_django.get_scheduler().sync.pause("billing.sync", "deploy")
    row = job_row(admin_client_.get(JOBS).content.decode(), "billing.sync")
    assert "not declared in this project" in row
    assert 'value="Resume"' in row
    assert 'value="Run now"' not in row


def test_a_store_without_fleet_records_says_workers_are_unknown() -> None:
    found = fleet.read_fleet(None)
    assert not found.known
    assert not found.none_alive


# ------------------------------------------------------------------ run ↔ task


def test_a_run_that_enqueued_a_task_shows_the_task(db_store: Store,
                                                   admin_client_: Client) -> None:
    name = f"testapp.enqueue-{uuid.uuid4().hex[:6]}"
    reported = iter(["SUCCESSFUL", None])

    def enqueue(ctx: JobContext) -> None:
        ctx.meta.update(task_id="4f0c9e2a-task", task_backend="default",
                        task_name="shop.tasks.report", notes="kept")
        status = next(reported)
        if status:
            ctx.meta["task_status"] = status

    anarchon_django.every(name, "1h", enqueue)
    run_jobs(name, name)
    found = rows(admin_client_.get(f"{HISTORY}?job={name}").content.decode())
    assert len(found) == 2
    unreported, reported_row = found[0]["html"], found[1]["html"]
    for html in (unreported, reported_row):
        assert 'data-task-id="4f0c9e2a-task"' in html
        assert "<code>4f0c9e2a-task</code>" in html  # no database backend's admin: no link
        assert "shop.tasks.report" in html
        assert "on default" in html
        assert "task_id=" not in html  # shown as the task, not again as meta
        assert "notes=kept" in html
    assert 'st-task-successful">successful</span>' in reported_row
    assert "outcome not reported" in unreported


_TASKS_DB_SITE = """
import importlib.util, json, sys
import django
from django.conf import settings
urlpatterns = []
settings.configure(
    SECRET_KEY="t", USE_TZ=True, ROOT_URLCONF="__main__",
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    INSTALLED_APPS=["django.contrib.admin", "django.contrib.auth",
                    "django.contrib.contenttypes", "django.contrib.messages",
                    "django.contrib.sessions",
                    *([] if importlib.util.find_spec("django.tasks") else ["django_tasks"]),
                    "django_tasks_db", "anarchon_django"],
    TASKS={"db": {"BACKEND": "django_tasks_db.DatabaseBackend"},
           "now": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}},
)
django.setup()
from django.contrib import admin
from django.urls import path
urlpatterns.append(path("admin/", admin.site.urls))
from anarchon_django.tasklinks import task_link
meta = {"task_id": sys.argv[1], "task_name": "shop.tasks.report", "task_status": "READY"}
print(json.dumps([getattr(task_link({**meta, "task_backend": alias}, admin.site), "url", None)
                  for alias in ("db", "now", "missing")]))
"""


def test_a_task_of_the_database_backend_links_to_its_admin_page() -> None:
    """With django-tasks-db's admin registered, the task id opens its TaskResult's page."""
    import json  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    task_id = str(uuid.uuid4())
    done = subprocess.run([sys.executable, "-c", _TASKS_DB_SITE, task_id], check=True,
                          capture_output=True, text=True, timeout=60)
    assert json.loads(done.stdout) == [
        f"/admin/django_tasks_database/dbtaskresult/{task_id}/change/", None, None]
