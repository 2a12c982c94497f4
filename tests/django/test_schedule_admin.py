"""The Schedule admin: list with next and last run, validated forms, slot preview, actions,
the code's jobs read-only beside them, permissions; real stores."""

from __future__ import annotations

import re
import uuid
from html import unescape
from typing import Any

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.test import Client

import anarchon_django
from anarchon_django import views
from anarchon_django.models import Schedule
from tests.django.conftest import Store
from tests.django.testapp.models import Note

pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "pg"])

LIST = "/admin/anarchon_django/schedule/"
ADD = f"{LIST}add/"
JOBS = "/admin/anarchon_django/job/"


def unique(prefix: str = "adm") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def user(name: str, *perms: str, superuser: bool = False) -> User:
    account = User.objects.create_user(name, password="pw", is_staff=True,
                                       is_superuser=superuser)
    for codename in perms:
        account.user_permissions.add(Permission.objects.get(
            content_type__app_label="anarchon_django", codename=codename))
    return account


def client_for(account: User) -> Client:
    client = Client()
    client.force_login(account)
    return client


@pytest.fixture
def boss() -> Client:
    return client_for(user("boss", superuser=True))


def make(**fields: Any) -> Schedule:
    values = {"name": unique(), "target": "testapp.greet",
              "every": "" if "cron" in fields else "1h", **fields}
    return Schedule.objects.create(**values)


def list_rows(html: str) -> dict[str, str]:
    """The change list's rows by schedule name: each row's HTML."""
    out = {}
    for row in re.findall(r"<tr>(.*?)</tr>", html, re.S):
        name = re.search(r'<th class="field-name"><a [^>]*>([^<]+)</a>', row)
        if name:
            out[unescape(name.group(1))] = row
    return out


def cell(row: str, field: str) -> str:
    match = re.search(rf'<td class="field-{field}[^"]*">(.*?)</td>', row, re.S)
    assert match, f"no {field} cell in {row}"
    return unescape(match.group(1))


def form_data(**fields: Any) -> dict[str, Any]:
    """What the add form posts for a valid schedule, with ``fields`` over it."""
    return {"name": unique(), "target_kind": "auto", "target": "testapp.greet",
            "args": "[]", "kwargs": "{}", "task_options": "{}", "description": "",
            "every": "", "cron": "", "tz": "", "dst": "", "enabled": "on",
            "timeout_ms": "", "jitter_ms": "", "max_late_ms": "", "overlap": "",
            "max_attempts": "", "catch_up_ms": "", "catch_up": "", **fields}


def action(client: Client, name: str, *rows: Schedule) -> Any:
    return client.post(LIST, {"action": name, "_selected_action": [r.pk for r in rows]},
                       follow=True)


def page_messages(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# ---------------------------------------------------------------- the list


def test_the_list_shows_next_and_last_run(store: Store, boss: Client) -> None:
    ran = make(cron="0 8 * * *", tz="UTC")
    idle = make(every="5m")
    off = make(enabled=False)
    assert views.run_now(ran.name, who="boss").run is not None
    html = boss.get(LIST).content.decode()
    found = list_rows(html)
    assert {ran.name, idle.name, off.name} <= set(found)
    assert cell(found[ran.name], "timing") == "cron 0 8 * * * UTC"
    assert re.search(r"\d{4}-\d\d-\d\d 08:00:00 UTC", cell(found[ran.name], "next_run"))
    last = cell(found[ran.name], "last_run")
    assert "st-success" in last
    assert "manual, " in last
    assert cell(found[idle.name], "last_run") == "never"
    # An interval's next run is in TIME_ZONE (Athens: EET or EEST).
    assert re.search(r":[0-5][05]:00 EE[S]?T", cell(found[idle.name], "next_run"))
    assert cell(found[idle.name], "timing") == "every 5m"
    assert "disabled" in cell(found[off.name], "next_run")
    assert "store unavailable" not in html


def test_one_read_of_the_store_per_page(db_store: Store, boss: Client,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [make() for _ in range(4)]
    views.run_now(rows[0].name, who="boss")
    reader = anarchon_django.get_reader()
    calls = []
    real = reader.sync.job_names

    def spy() -> Any:
        calls.append(1)
        return real()

    monkeypatch.setattr(reader.sync, "job_names", spy)
    html = boss.get(LIST).content.decode()
    assert len(list_rows(html)) == 4
    assert "st-success" in cell(list_rows(html)[rows[0].name], "last_run")
    assert len(calls) == 1


def test_filters_and_search(db_store: Store, boss: Client) -> None:
    handler = make(target_kind="handler", description="the nightly digest")
    other = make(enabled=False)
    assert set(list_rows(boss.get(f"{LIST}?enabled__exact=0").content.decode())) == \
        {other.name}
    assert set(list_rows(boss.get(f"{LIST}?target_kind__exact=handler").content.decode())
               ) == {handler.name}
    assert set(list_rows(boss.get(f"{LIST}?q=nightly").content.decode())) == {handler.name}
    assert set(list_rows(boss.get(f"{LIST}?q={other.name}").content.decode())) == \
        {other.name}


def test_a_store_that_is_down_does_not_break_the_list(settings: Any, anarchon_reset: None,
                                                      boss: Client) -> None:
    row = make()
    # Nothing listens on port 1 of the loopback: every read of the store is refused.
    settings.ANARCHON = {"BACKEND": "redis://127.0.0.1:1/0"}
    response = boss.get(LIST)
    assert response.status_code == 200
    html = unescape(response.content.decode())
    last = cell(list_rows(html)[row.name], "last_run")
    assert re.sub(r"<[^>]+>", "", last) == "store unavailable"
    assert "Connect" in last  # the reason, in the title
    assert 'id="anarchon-store-error"' in html
    assert "testapp.note" in html  # the code's jobs still listed
    assert re.search(r"\d{4}-\d\d-\d\d", cell(list_rows(html)[row.name], "next_run"))


def test_an_invalid_row_says_why_it_is_not_scheduled(db_store: Store, boss: Client) -> None:
    bad = make(cron="61 * * * *")  # created by code, never validated
    shadow = make(name="testapp.note")
    found = list_rows(boss.get(LIST).content.decode())
    assert "cron" in cell(found[bad.name], "next_run")
    assert "declared in code" in cell(found[shadow.name], "next_run")


# ---------------------------------------------------------------- code jobs


def test_jobs_declared_in_code_are_listed_read_only(db_store: Store, boss: Client) -> None:
    row = make()
    assert views.run_now(row.name, who="boss").run is not None  # loads the table's jobs
    html = boss.get(LIST).content.decode()
    section = html[html.index('id="anarchon-code-jobs"'):]
    names = re.findall(r'<tr class="anarchon-code-job" data-job="([^"]+)">', section)
    declared = {j.name for j in anarchon_django.get_scheduler().jobs()} - {row.name}
    assert set(names) == declared
    assert {"testapp.note", "testapp.report"} <= set(names)
    assert row.name not in names
    assert "cron 0 8 * * * Europe/Athens" in section
    assert f'href="{JOBS}"' in section
    assert "<input" not in section
    assert "<form" not in section
    # A viewer without the Jobs page's permission gets no link to it.
    viewer = client_for(user("viewer", "view_schedule"))
    section = viewer.get(LIST).content.decode().split('id="anarchon-code-jobs"')[1]
    assert "testapp.note" in section
    assert JOBS not in section


# ---------------------------------------------------------------- add and change


def test_a_bad_cron_is_a_form_error_on_cron(db_store: Store, boss: Client) -> None:
    data = form_data(cron="61 * * * *")
    response = boss.post(ADD, data)
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert set(errors) == {"cron"}, errors
    assert "61" in errors["cron"][0]
    assert not Schedule.objects.filter(name=data["name"]).exists()
    both = boss.post(ADD, form_data(cron="0 8 * * *", every="5m"))
    assert "either every" in str(both.context["adminform"].form.non_field_errors())


def test_a_valid_add_creates_the_row(db_store: Store, boss: Client) -> None:
    data = form_data(cron="0 8 * * 1-5", tz="Europe/Athens", kwargs='{"who": "ana"}',
                     max_attempts="3")
    response = boss.post(ADD, data)
    assert response.status_code == 302, response.context["adminform"].form.errors
    row = Schedule.objects.get(name=data["name"])
    assert (row.cron, row.tz, row.kwargs, row.max_attempts, row.enabled) == \
        ("0 8 * * 1-5", "Europe/Athens", {"who": "ana"}, 3, True)
    html = boss.get(f"{LIST}{row.pk}/change/").content.decode()
    for title in ("What runs", "When", "Options", "Advanced"):
        assert f">{title}</" in html


def test_the_preview_marks_the_dst_change(db_store: Store, boss: Client) -> None:
    row = make(cron="*/30 * * * *", tz="Europe/Athens")
    html = boss.get(f"{LIST}{row.pk}/change/",
                    {"preview_from": "2026-10-25T02:00+03:00"}).content.decode()
    slots = re.findall(r'<tr class="anarchon-slot( anarchon-dst)?" data-at="([^"]+)">(.*?)</tr>',
                       html, re.S)
    assert [at for _, at, _ in slots] == [
        "2026-10-25T02:00:00+03:00", "2026-10-25T02:30:00+03:00",
        "2026-10-25T03:00:00+03:00", "2026-10-25T03:30:00+03:00",
        "2026-10-25T03:00:00+02:00"]
    assert [bool(dst) for dst, _, _ in slots] == [False, False, True, True, True]
    assert "DST fall-back, first pass (both: the wildcard default)" in slots[2][2]
    assert "DST fall-back, second pass (both: the wildcard default)" in slots[4][2]
    assert "03:00:00 EET" in slots[4][2]
    assert "03:00:00 EEST" in slots[2][2]
    # A fixed-time job in the spring-forward gap: shifted, and the note says so.
    spring = make(cron="30 3 * * *", tz="Europe/Athens")
    html = unescape(boss.get(f"{LIST}{spring.pk}/change/",
                             {"preview_from": "2026-03-28T12:00+02:00"}).content.decode())
    first = re.findall(r'data-at="([^"]+)">(.*?)</tr>', html, re.S)[0]
    assert first[0] == "2026-03-29T04:00:00+03:00"
    assert "DST spring-forward gap: 03:30 shifted to 04:00 (shift: the fixed-time default)" \
        in first[1]
    # An unescaped "+" arrives as a space; the preview still reads it.
    again = boss.get(f"{LIST}{row.pk}/change/?preview_from=2026-10-25T02:00+03:00")
    assert "2026-10-25T03:00:00+02:00" in again.content.decode()
    # A time that is not one says so and previews from now.
    bad = unescape(boss.get(f"{LIST}{row.pk}/change/?preview_from=soon").content.decode())
    assert "is not an ISO 8601 time" in bad
    assert len(re.findall(r'<tr class="anarchon-slot', bad)) == 5


def test_the_preview_respects_expiry_and_explains_an_invalid_row(db_store: Store,
                                                                 boss: Client) -> None:
    row = make(cron="0 * * * *", tz="UTC")
    Schedule.objects.filter(pk=row.pk).update(
        start_at="2026-01-01T00:00Z", expires_at="2026-01-01T03:00Z")
    html = boss.get(f"{LIST}{row.pk}/change/",
                    {"preview_from": "2025-12-31T23:30Z"}).content.decode()
    assert re.findall(r'data-at="([^"]+)"', html) == [
        "2026-01-01T00:00:00+00:00", "2026-01-01T01:00:00+00:00",
        "2026-01-01T02:00:00+00:00"]
    Schedule.objects.filter(pk=row.pk).update(cron="61 * * * *")
    html = unescape(boss.get(f"{LIST}{row.pk}/change/").content.decode())
    assert 'id="anarchon-preview-problem"' in html
    assert "cron: " in html


# ---------------------------------------------------------------- actions


def test_enable_and_disable_change_the_revision(db_store: Store, boss: Client) -> None:
    rows = [make(), make()]
    before = {r.pk: r.revision for r in rows}
    response = action(boss, "disable", *rows)
    assert "2 schedules disabled" in page_messages(response)[0]
    after = {r.pk: (r.enabled, r.revision) for r in Schedule.objects.filter(pk__in=before)}
    assert all(not enabled for enabled, _ in after.values())
    assert all(after[pk][1] != before[pk] for pk in before)
    response = action(boss, "enable", *rows)
    assert "2 schedules enabled" in page_messages(response)[0]
    again = {r.pk: (r.enabled, r.revision) for r in Schedule.objects.filter(pk__in=before)}
    assert all(enabled for enabled, _ in again.values())
    assert all(again[pk][1] != after[pk][1] for pk in before)
    # Each row's admin history says who changed what; a row already enabled is left alone.
    history = LogEntry.objects.filter(object_id=str(rows[0].pk)).order_by("pk")
    assert [(e.user.username, e.get_change_message()) for e in history] == \
        [("boss", "Changed enabled.")] * 2
    assert "0 schedules enabled" in page_messages(action(boss, "enable", rows[0]))[0]
    assert Schedule.objects.get(pk=rows[0].pk).revision == again[rows[0].pk][1]


def test_run_now_with_the_permission(store: Store) -> None:
    operator = client_for(user("operator", "view_schedule", "run_schedule"))
    row = make(kwargs={"who": "action"})
    response = action(operator, "run_now", row)
    assert any(f"Manual run of {row.name!r} succeeded in" in m
               for m in page_messages(response)), page_messages(response)
    assert [n.runner for n in Note.objects.filter(job=row.name)] == ["action"]
    [run] = anarchon_django.get_reader().sync.history(row.name)
    assert run.manual
    assert run.meta["requested_by"] == "operator"
    # The change page's button.
    page = operator.get(f"{LIST}{row.pk}/change/").content.decode()
    assert 'id="anarchon-run-now"' in page
    response = operator.post(f"{LIST}{row.pk}/run/", follow=True)
    assert any("succeeded in" in m for m in page_messages(response))
    assert Note.objects.filter(job=row.name).count() == 2
    assert [e.get_change_message() for e in LogEntry.objects.filter(
        object_id=str(row.pk)).order_by("pk")] == ["Ran now (success)."] * 2


def test_run_now_without_the_permission_is_refused(db_store: Store) -> None:
    editor = client_for(user("editor", "view_schedule", "change_schedule"))
    row = make()
    html = editor.get(LIST).content.decode()
    assert 'value="run_now"' not in html
    assert 'value="disable"' in html
    action(editor, "run_now", row)
    assert editor.post(f"{LIST}{row.pk}/run/").status_code == 403
    assert 'id="anarchon-run-now"' not in editor.get(f"{LIST}{row.pk}/change/"
                                                     ).content.decode()
    assert not Note.objects.filter(job=row.name).exists()
    assert editor.get(f"{LIST}{row.pk}/run/").status_code in (403, 405)


def test_the_list_says_when_workers_ignore_the_table(db_store: Store, settings: Any,
                                                     boss: Client) -> None:
    assert 'id="anarchon-schedules-off"' not in boss.get(LIST).content.decode()
    settings.ANARCHON = {**db_store.anarchon, "DATABASE_SCHEDULES": False}
    row = make()
    assert 'id="anarchon-schedules-off"' in boss.get(LIST).content.decode()
    texts = page_messages(action(boss, "run_now", row))
    assert any("DATABASE_SCHEDULES" in t for t in texts), texts


def test_run_now_refuses_a_disabled_or_shadowed_row(db_store: Store, boss: Client) -> None:
    off = make(enabled=False)
    shadow = make(name="testapp.note")
    response = action(boss, "run_now", off, shadow)
    texts = page_messages(response)
    assert any("is disabled" in t for t in texts), texts
    assert any("declared in code" in t for t in texts), texts
    assert not Note.objects.filter(job__in=[off.name, shadow.name]).exists()


# ---------------------------------------------------------------- permissions


def test_a_viewer_sees_but_cannot_change(db_store: Store) -> None:
    viewer = client_for(user("viewer", "view_schedule"))
    row = make()
    html = viewer.get(LIST).content.decode()
    assert row.name in list_rows(html)
    assert 'value="disable"' not in html
    assert 'value="run_now"' not in html
    assert viewer.get(ADD).status_code == 403
    page = viewer.get(f"{LIST}{row.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert 'name="_save"' not in text
    assert 'id="anarchon-preview"' in text
    response = viewer.post(f"{LIST}{row.pk}/change/", form_data(name=row.name, every="5m"))
    assert response.status_code == 403
    assert Schedule.objects.get(pk=row.pk).every == "1h"
    action(viewer, "disable", row)
    assert Schedule.objects.get(pk=row.pk).enabled
    assert viewer.post(f"{LIST}{row.pk}/delete/", {"post": "yes"}).status_code == 403
    nobody = client_for(user("intern"))
    assert nobody.get(LIST).status_code == 403
