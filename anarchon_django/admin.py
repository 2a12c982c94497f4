"""The admin: "Jobs" and "Run history", over the store of any backend.

"Jobs": schedule, next run, last status, recent slots, run now. "Run history": read-only,
filtered, searched and paginated through the read model.

Both pages are custom views over the store, for every backend; the models behind the two
index entries have no table (see :mod:`anarchon_django.models`). They extend Django's own
change-list template, so breadcrumbs, dark mode and translations are the admin's own.
"Jobs" also shows the live workers (from the fleet's registry records). Staff only:
viewing needs ``anarchon_django.view_job`` / ``view_run``, "run now" needs
``anarchon_django.run_job``, "pause" and "resume" (for every worker) need
``anarchon_django.pause_job``. Nothing can be added, changed or deleted.

The schedules kept in the database have a normal admin of their own
(:mod:`anarchon_django.scheduleadmin`, imported at the end of this module).

With a custom admin site, register them on it::

    site.register(anarchon_django.models.Job, anarchon_django.admin.JobAdmin)
    site.register(anarchon_django.models.Run, anarchon_django.admin.RunHistoryAdmin)
    site.register(anarchon_django.models.Schedule,
                  anarchon_django.scheduleadmin.ScheduleAdmin)
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme

from anarchon_core import Scheduler

from . import fleet, runtime, tasklinks, views
from .models import Job, Run

__all__ = ["JobAdmin", "RunHistoryAdmin"]

log = logging.getLogger("anarchon.django")
RUN_PERMISSION = "anarchon_django.run_job"
PAUSE_PERMISSION = "anarchon_django.pause_job"


class _StoreAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """An admin entry over the store: view-only, no add, change or delete."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        """Runs are made by the scheduler, never by hand."""
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """History is read-only."""
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        """History is trimmed by the store (``HISTORY_SIZE``), never deleted by hand."""
        return False

    def _context(self, request: HttpRequest, title: str, **extra: Any) -> dict[str, Any]:
        opts = self.model._meta
        # Django's change-list template reads its breadcrumbs from ``cl.opts``.
        return {**self.admin_site.each_context(request), "opts": opts, "cl": {"opts": opts},
                "title": title, "has_view_permission": True,
                "can_run": _can(request, RUN_PERMISSION),
                "can_pause": _can(request, PAUSE_PERMISSION),
                "zone": timezone.get_current_timezone_name(), **extra}

    def _guard(self, request: HttpRequest) -> None:
        if not self.has_view_permission(request):
            raise PermissionDenied


def _can(request: HttpRequest, permission: str) -> bool:
    user: Any = request.user  # any user model: has_perm is what the admin relies on
    return bool(user.is_active and user.is_staff and user.has_perm(permission))


def _target(request: HttpRequest, default: str) -> str:
    """Where a POST action sends the user back: its ``next``, if it is on this site."""
    target = request.POST.get("next") or default
    if not url_has_allowed_host_and_scheme(target, {request.get_host()},
                                           require_https=request.is_secure()):
        return default
    return target


def report_run_now(request: HttpRequest, result: views.RunNowResult) -> None:
    """Tell the user who pressed "run now" how the run went, as an admin message."""
    name = result.job
    # The admin capitalises a message's first letter: the job name, case-sensitive,
    # never comes first.
    if result.error:
        messages.error(request, f"Manual run of {name!r} could not start: {result.error}")
    elif result.run is None:
        messages.info(request, f"Manual run of {name!r} is running now in this process; "
                      "it shows as running in history until it ends.")
    elif result.run.status == "success":
        messages.success(request, f"Manual run of {name!r} succeeded in "
                         f"{result.run.duration_ms} ms.")
    else:
        messages.warning(request, f"Manual run of {name!r} ended {result.run.status}: "
                         f"{result.run.error or 'no error text'}")


def _reader(errors: list[str]) -> Scheduler | None:
    try:
        return runtime.get_reader()
    except Exception as exc:  # noqa: BLE001 - the page shows what is wrong
        errors.append(views.store_error(exc))
        return None


def _scheduler(errors: list[str]) -> Scheduler | None:
    try:
        return runtime.get_scheduler()
    except Exception as exc:  # noqa: BLE001
        errors.append(views.store_error(exc))
        return None


@admin.register(Run)
class RunHistoryAdmin(_StoreAdmin):
    """Run history: one row per attempt, newest first; filters job, status, runner; search."""

    def get_urls(self) -> list[URLPattern]:
        """Only the list: there is no add, change or delete page."""
        return [path("", self.admin_site.admin_view(self.run_history_view),
                     name="anarchon_django_run_changelist")]

    def run_history_view(self, request: HttpRequest) -> HttpResponse:
        """The history list (GET ``?job=&status=&runner=&q=&n=&before=``)."""
        self._guard(request)
        errors: list[str] = []
        get = request.GET
        job = get.get("job") or None
        status = get.get("status") or None
        if status not in (None, *views.STATUSES):
            status = None
        runner = (get.get("runner") or "").strip() or None
        search = (get.get("q") or "").strip() or None
        limit = views.page_size(get.get("n"))
        before, bad_cursor = views.page_cursor(get.get("before"))
        if bad_cursor:
            errors.append(bad_cursor)
        reader = _reader(errors)
        scheduler = _scheduler(errors)
        page = views.HistoryPage([], None)
        if reader is not None:
            try:
                page = views.history_page(reader, job=job, status=status, runner=runner,
                                          search=search, limit=limit, before=before)
            except Exception as exc:  # noqa: BLE001 - a store error or a bad cursor
                errors.append(views.store_error(exc))
        declared = {j.name for j in scheduler.jobs()} if scheduler is not None else set()
        filters = {k: v for k, v in (("job", job), ("status", status), ("runner", runner),
                                     ("q", search), ("n", str(limit) if limit != 50 else None))
                   if v}
        rows = [{"run": r, "scheduled": views.local(r.scheduled_at),
                 "started": views.local(r.started_at), "finished": views.local(r.finished_at),
                 "task": tasklinks.task_link(r.meta, self.admin_site),
                 "meta": sorted((k, v) for k, v in r.meta.items()
                                if k not in tasklinks.TASK_KEYS)} for r in page.runs]
        context = self._context(
            request, "Run history", runs=rows, page=page, errors=errors,
            jobs=views.job_choices(scheduler, reader), statuses=views.STATUSES,
            page_sizes=views.PAGE_SIZES, job=job, status=status, runner=runner,
            search=search, limit=limit, first_page=before is None,
            runners=sorted({r.runner for r in page.runs}),
            next_url=("?" + urlencode({**filters, "before": page.cursor}))
            if page.cursor else None,
            newest_url="?" + urlencode(filters),
            run_now_job=job if job in declared else None,
            run_url=reverse(f"{self.admin_site.name}:anarchon_django_job_run"),
            backend=reader.backend.describe() if reader is not None else "",
        )
        return TemplateResponse(request, "admin/anarchon_django/history.html", context)


@admin.register(Job)
class JobAdmin(_StoreAdmin):
    """Jobs: the live workers; per job schedule, next run, last run, recent slots, actions.

    The actions: "run now" in this process, and "pause" / "resume" for every worker.
    """

    def get_urls(self) -> list[URLPattern]:
        """The job table and its actions: run now, pause, resume."""
        return [
            path("", self.admin_site.admin_view(self.jobs_view),
                 name="anarchon_django_job_changelist"),
            path("run/", self.admin_site.admin_view(self.run_now_view),
                 name="anarchon_django_job_run"),
            path("pause/", self.admin_site.admin_view(self.pause_view),
                 name="anarchon_django_job_pause"),
            path("resume/", self.admin_site.admin_view(self.resume_view),
                 name="anarchon_django_job_resume"),
        ]

    def jobs_view(self, request: HttpRequest) -> HttpResponse:
        """The job table."""
        self._guard(request)
        errors: list[str] = []
        scheduler = _scheduler(errors)
        reader = _reader(errors)
        rows: list[views.JobRow] = []
        if scheduler is not None:
            rows, error = views.job_rows(scheduler, reader)
            if error:
                errors.append(error)
        workers = fleet.read_fleet(reader)
        rows = fleet.apply(workers, rows)
        site = self.admin_site.name
        context = self._context(
            request, "Jobs", rows=rows, errors=errors, fleet=workers,
            history_url=reverse(f"{site}:anarchon_django_run_changelist"),
            run_url=reverse(f"{site}:anarchon_django_job_run"),
            pause_url=reverse(f"{site}:anarchon_django_job_pause"),
            resume_url=reverse(f"{site}:anarchon_django_job_resume"),
            backend=scheduler.backend.describe() if scheduler is not None else "",
            instance=scheduler.instance_id if scheduler is not None else "",
            running_here=bool(scheduler and scheduler.running),
        )
        return TemplateResponse(request, "admin/anarchon_django/jobs.html", context)

    def run_now_view(self, request: HttpRequest) -> HttpResponse:
        """POST ``job=<name>``: run the job now in this process, recorded as manual."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not _can(request, RUN_PERMISSION):
            raise PermissionDenied
        name = request.POST.get("job", "")
        history = reverse(f"{self.admin_site.name}:anarchon_django_run_changelist")
        target = (_target(request, history) if request.POST.get("next")
                  else f"{history}?{urlencode({'job': name})}")
        errors: list[str] = []
        scheduler = _scheduler(errors)
        if scheduler is None or name not in {j.name for j in scheduler.jobs()}:
            messages.error(request, errors[0] if errors else
                           f"No job named {name!r} is declared in this project.")
            return HttpResponseRedirect(target)
        who = request.user.get_username()
        log.info("%s asked to run %r now", who, name)
        report_run_now(request, views.run_now(name, who=who))
        return HttpResponseRedirect(target)

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        """POST ``job=<name>``: pause the job for every worker (slots recorded skipped)."""
        return self._control(request, pause=True)

    def resume_view(self, request: HttpRequest) -> HttpResponse:
        """POST ``job=<name>``: resume a paused job for every worker."""
        return self._control(request, pause=False)

    def _control(self, request: HttpRequest, *, pause: bool) -> HttpResponse:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not _can(request, PAUSE_PERMISSION):
            raise PermissionDenied
        name = request.POST.get("job", "")
        target = _target(request, reverse(
            f"{self.admin_site.name}:anarchon_django_job_changelist"))
        errors: list[str] = []
        scheduler = _scheduler(errors)
        if scheduler is None:
            messages.error(request, errors[0])
            return HttpResponseRedirect(target)
        who = request.user.get_username()
        verb = "pause" if pause else "resume"
        log.info("%s asked to %s %r for every worker", who, verb, name)
        # The admin capitalises a message's first letter: the job name never comes first.
        try:
            if pause:
                scheduler.sync.pause(name, f"paused by {who} in the admin"[:500])
            else:
                was = scheduler.sync.resume(name)
        except Exception as exc:  # noqa: BLE001 - reported to the user who pressed the button
            messages.error(request, f"Could not {verb} {name!r}: {views.store_error(exc)}")
            return HttpResponseRedirect(target)
        if pause:
            messages.success(request, f"Paused {name!r} for every worker: its slots are "
                             "recorded skipped (paused) until it is resumed; run now still "
                             "runs it.")
        elif was:
            messages.success(request, f"Resumed {name!r} for every worker: its next slot runs.")
        else:
            messages.info(request, f"Nothing to resume: {name!r} was not paused.")
        return HttpResponseRedirect(target)


# The Schedule admin uses the helpers above; importing it registers it on the default site.
from . import scheduleadmin  # noqa: E402, F401
