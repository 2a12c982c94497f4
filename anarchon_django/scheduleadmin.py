"""The admin of the schedules kept in the database (:class:`~anarchon_django.models.Schedule`).

A normal ``ModelAdmin``: add, change and delete need Django's own permissions, and every
value goes through the model's ``full_clean()`` (the checks a job declared in code gets,
each error on its field). The change list adds each row's next run (in the row's zone),
its last run and status (one read of the store per page; a store that is down says
"store unavailable"), and below it the jobs declared in code, read-only. The change page
previews the next slots, each one a daylight-saving change decided marked with the rule
that applied. The actions: enable and disable (every worker picks the change up within
``SCHEDULES_POLL_MS``) and run now (``anarchon_django.run_schedule``).

With a custom admin site, register it on it::

    site.register(anarchon_django.models.Schedule, anarchon_django.scheduleadmin.ScheduleAdmin)
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, tzinfo
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import NoReverseMatch, URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html

from anarchon_core import CronSchedule, JobInfo, Run, Schedule, Scheduler, slot_to_datetime

from . import conf, dbschedules, registry, runtime, views
from .admin import _can, report_run_now
from .models import Schedule as ScheduleRow

__all__ = ["PREVIEW_SLOTS", "RUN_NOW_LIMIT", "RUN_SCHEDULE_PERMISSION", "PreviewSlot",
           "RowState", "ScheduleAdmin", "ScheduleChangeList", "checked", "code_jobs",
           "parse_from", "preview", "row_state", "upcoming"]

log = logging.getLogger("anarchon.django.schedules")

RUN_SCHEDULE_PERMISSION = "anarchon_django.run_schedule"
#: Slots the change page previews.
PREVIEW_SLOTS = 5
#: Most rows one "run now" action runs: each waits up to ``ADMIN_RUN_NOW_WAIT_MS``.
RUN_NOW_LIMIT = 10
#: The attribute of a listed row that holds its :class:`RowState`.
_STATE = "anarchon_state"
_WHEN = "%Y-%m-%d %H:%M:%S %Z"


@dataclass(frozen=True)
class PreviewSlot:
    """One upcoming slot: when, in the row's zone, and what a DST change did, if anything."""

    at: datetime
    dst_note: str | None = None

    @property
    def shown(self) -> str:
        """``2026-10-25 03:00:00 EET``, in the row's zone."""
        return self.at.strftime(_WHEN)

    @property
    def offset(self) -> str:
        """The slot's UTC offset, ``+02:00``."""
        return self.at.isoformat()[-6:]


@dataclass
class RowState:
    """What the change list shows of a row beside its fields."""

    timing: str
    zone: tzinfo
    next_run: datetime | None = None
    #: Why the row runs no slot (invalid, disabled, expired, its name taken by code).
    problem: str | None = None
    last: Run | None = None
    store_error: str | None = None


def _ms(moment: datetime | None) -> int | None:
    return None if moment is None else round(moment.timestamp() * 1000)


def _now_ms() -> int:
    return round(time.time() * 1000)


def _defaults() -> dict[str, Any]:
    try:
        return conf.load().job_defaults
    except Exception:  # noqa: BLE001 - a bad ANARCHON shows on the pages that use the store
        return {}


def _validation_text(exc: ValidationError) -> str:
    if hasattr(exc, "error_dict"):
        return "; ".join(f"{name}: {' '.join(str(m) for m in errors)}"
                         for name, errors in exc.message_dict.items())
    return " ".join(exc.messages)


def checked(row: ScheduleRow, defaults: dict[str, Any] | None = None
            ) -> tuple[Schedule | None, str | None]:
    """The row's schedule as a worker computes it, or None and why it is not scheduled."""
    try:
        return dbschedules.validate(row, _defaults() if defaults is None else defaults), None
    except ValidationError as exc:
        return None, _validation_text(exc)
    except Exception as exc:  # noqa: BLE001 - a hostile row must not break the page
        return None, f"{type(exc).__name__}: {exc}"


def _zone(row: ScheduleRow, schedule: Schedule | None) -> tzinfo:
    if isinstance(schedule, CronSchedule):
        return schedule.zone
    return timezone.get_current_timezone()


def _timing(row: ScheduleRow, schedule: Schedule | None) -> str:
    if schedule is not None:
        return schedule.describe()
    if row.every:
        return f"every {row.every}"
    return f"cron {row.cron} {row.tz or timezone.get_current_timezone_name()}"


def upcoming(row: ScheduleRow, schedule: Schedule, after_ms: int, count: int) -> list[int]:
    """The row's next ``count`` slots strictly after ``after_ms``, within its start and expiry."""
    start = _ms(row.start_at)
    if start is not None:
        after_ms = max(after_ms, start - 1)
    end = _ms(row.expires_at)
    return [s for s in schedule.upcoming(after_ms, count) if end is None or s < end]


def _database_schedules() -> bool:
    """Whether this project's workers run the table's rows (some kinds or all)."""
    try:
        return bool(conf.load().database_schedules)
    except Exception:  # noqa: BLE001 - a bad ANARCHON shows on the pages that use the store
        return True


def _declared_names() -> set[str]:
    return {d.name for d in registry.declarations()}


def row_state(row: ScheduleRow, *, now_ms: int, defaults: dict[str, Any],
              declared: set[str], last: dict[str, Run | None] | None,
              store_error: str | None) -> RowState:
    """The row's timing, next run and last run, from its schedule and the store's read."""
    schedule, problem = checked(row, defaults)
    state = RowState(_timing(row, schedule), _zone(row, schedule), problem=problem,
                     store_error=store_error, last=(last or {}).get(row.name))
    if schedule is None:
        return state
    if row.name in declared:
        state.problem = "a job of that name is declared in code, which runs instead"
    elif not row.enabled:
        state.problem = "disabled"
    else:
        slots = upcoming(row, schedule, now_ms, 1)
        if slots:
            state.next_run = slot_to_datetime(slots[0]).astimezone(state.zone)
        else:
            state.problem = "none: expired"
    return state


def preview(row: ScheduleRow, after: datetime, count: int = PREVIEW_SLOTS
            ) -> tuple[list[PreviewSlot], str | None]:
    """The row's next ``count`` slots from ``after`` (included), or why there are none.

    A slot a daylight-saving change decided carries the core's note of it (the one
    ``anarchon next`` prints), naming the rule that applied.
    """
    schedule, problem = checked(row)
    if schedule is None:
        return [], problem
    zone = _zone(row, schedule)
    slots = upcoming(row, schedule, round(after.timestamp() * 1000) - 1, count)
    notes = schedule.dst_note if isinstance(schedule, CronSchedule) else None
    return [PreviewSlot(slot_to_datetime(s).astimezone(zone), notes(s) if notes else None)
            for s in slots], None


def parse_from(text: str | None, zone: tzinfo) -> tuple[datetime | None, str | None]:
    """``?preview_from=``: an ISO datetime (naive: in ``zone``), or None and why not."""
    if not text:
        return None, None
    text = text.strip()
    candidates = [text]
    # An unescaped "+" in a query string arrives as a space: "02:00 03:00".
    head, sep, tail = text.rpartition(" ")
    if sep and head and tail[:1].isdigit():
        candidates.append(f"{head}+{tail}")
    for candidate in candidates:
        try:
            moment = datetime.fromisoformat(candidate)
        except ValueError:
            continue
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=zone)
        return moment, None
    return None, (f"preview_from={text[:60]!r} is not an ISO 8601 time "
                  "(2026-10-25T02:00+03:00); showing the slots from now.")


def code_jobs(scheduler: Scheduler, db_names: set[str]) -> list[JobInfo]:
    """The scheduler's jobs declared in code: all but the ones the table's rows made."""
    declared = _declared_names()
    return sorted((j for j in scheduler.jobs() if j.name in declared or j.name not in db_names),
                  key=lambda j: j.name)


class ScheduleChangeList(ChangeList):
    """The change list, each row of the page given its :class:`RowState`.

    The last runs come from one ``job_names()`` read of the store per page.
    """

    last_runs: dict[str, Run | None]
    store_error: str | None

    def get_results(self, request: HttpRequest) -> None:
        """The page's rows, then their state."""
        super().get_results(request)
        self.last_runs, self.store_error = {}, None
        try:
            self.last_runs = runtime.get_reader().sync.job_names()
        except Exception as exc:  # noqa: BLE001 - the page says the store is unavailable
            self.store_error = views.store_error(exc)
        now_ms, defaults, declared = _now_ms(), _defaults(), _declared_names()
        for row in self.result_list:
            setattr(row, _STATE, row_state(row, now_ms=now_ms, defaults=defaults,
                                           declared=declared, last=self.last_runs,
                                           store_error=self.store_error))


def _state(obj: ScheduleRow) -> RowState | None:
    state = getattr(obj, _STATE, None)
    return state if isinstance(state, RowState) else None


def _run_html(run: Run, zone: tzinfo) -> str:
    when = run.scheduled_at.astimezone(zone)
    return format_html(
        '<span class="anarchon-status st-{}">{}</span> <span class="nowrap">{}</span>'
        '<div class="anarchon-meta">{}{}</div>', run.status, run.status,
        when.strftime(_WHEN), "manual, " if run.manual else "", run.runner)


def _last_html(run: Run | None, zone: tzinfo, store_error: str | None) -> str:
    if store_error is not None:
        return format_html('<span class="anarchon-error anarchon-store-down" '
                           'title="{}">store unavailable</span>', store_error)
    return "never" if run is None else _run_html(run, zone)


@admin.register(ScheduleRow)
class ScheduleAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Schedules in the database: list with next and last run, validated forms, preview."""

    list_display = ("name", "timing", "target_shown", "enabled", "next_run", "last_run")
    list_filter = ("enabled", "target_kind")
    search_fields = ("name", "target", "description")
    readonly_fields = ("revision", "created_at", "updated_at")
    actions = ("enable", "disable", "run_now")
    fieldsets = (
        ("What runs", {"fields": ("name", "target_kind", "target", "args", "kwargs",
                                  "description")}),
        ("When", {"fields": ("every", "cron", "tz", "dst", "start_at", "expires_at",
                             "enabled", "one_off"),
                  "description": 'Either "every" or "cron". Slots are computed on the '
                                 "same grid by every worker."}),
        ("Options", {"fields": ("timeout_ms", "jitter_ms", "max_late_ms", "overlap",
                                "max_attempts"),
                     "description": "Empty: ANARCHON['JOB_DEFAULTS'], else the core's "
                                    "defaults."}),
        ("Advanced", {"fields": ("catch_up_ms", "catch_up", "task_options", "revision",
                                 "created_at", "updated_at"),
                      "classes": ("collapse",)}),
    )
    change_list_template = "admin/anarchon_django/schedule/change_list.html"
    change_form_template = "admin/anarchon_django/schedule/change_form.html"

    # ------------------------------------------------------------------ permissions

    def has_run_permission(self, request: HttpRequest) -> bool:
        """Whether the user may run a schedule now (``anarchon_django.run_schedule``)."""
        return _can(request, RUN_SCHEDULE_PERMISSION)

    # ------------------------------------------------------------------ change list

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        """The change list that reads each page's last runs once."""
        return ScheduleChangeList

    @admin.display(description="timing")
    def timing(self, obj: ScheduleRow) -> str:
        """``every 5m`` or ``cron 0 8 * * * Europe/Athens`` (with the DST rule if given)."""
        state = _state(obj)
        return state.timing if state else _timing(obj, None)

    @admin.display(description="target", ordering="target")
    def target_shown(self, obj: ScheduleRow) -> str:
        """The target, with its kind unless ``auto``."""
        if obj.target_kind == "auto":
            return str(obj.target)
        return format_html('{} <span class="anarchon-meta">({})</span>', obj.target,
                           obj.target_kind)

    @admin.display(description="next run")
    def next_run(self, obj: ScheduleRow) -> str:
        """The next slot in the row's zone, or why there is none."""
        state = _state(obj)
        if state is None:
            return "—"
        if state.next_run is not None:
            return format_html('<span class="nowrap anarchon-next">{}</span>',
                               state.next_run.strftime(_WHEN))
        css = "anarchon-meta" if state.problem == "disabled" else "anarchon-error"
        return format_html('<span class="{} anarchon-no-next">{}</span>', css,
                           state.problem or "—")

    @admin.display(description="last run")
    def last_run(self, obj: ScheduleRow) -> str:
        """The last run the store holds (status, slot, runner), or "store unavailable"."""
        state = _state(obj)
        if state is None:
            return "—"
        return _last_html(state.last, state.zone, state.store_error)

    def changelist_view(self, request: HttpRequest,
                        extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The list, then the jobs declared in code (read-only) with their last runs."""
        response = super().changelist_view(request, extra_context)
        if not isinstance(response, TemplateResponse) or response.context_data is None:
            return response  # a redirect after an action, or an error page
        cl = response.context_data.get("cl")
        last: dict[str, Run | None] = getattr(cl, "last_runs", {})
        store_error: str | None = getattr(cl, "store_error", None)
        rows, error = [], None
        try:
            scheduler = runtime.get_scheduler()
        except Exception as exc:  # noqa: BLE001 - shown in the section
            error = views.store_error(exc)
        else:
            infos = scheduler.jobs()
            db_names = set(ScheduleRow.objects.filter(name__in=[j.name for j in infos])
                           .values_list("name", flat=True))
            zone = timezone.get_current_timezone()
            rows = [{"name": j.name, "schedule": j.schedule,
                     "next_run": j.next_run_at.astimezone(zone).strftime(_WHEN),
                     "last": _last_html(last.get(j.name), zone, store_error)}
                    for j in code_jobs(scheduler, db_names)]
        site = self.admin_site.name
        jobs_url = None
        if _can(request, "anarchon_django.view_job"):
            try:
                jobs_url = reverse(f"{site}:anarchon_django_job_changelist")
            except NoReverseMatch:
                jobs_url = None  # the Jobs page is not on this site
        response.context_data.update(
            code_jobs=rows, code_jobs_error=error, jobs_url=jobs_url,
            store_error=store_error, schedules_off=not _database_schedules(),
            zone=timezone.get_current_timezone_name())
        return response

    # ------------------------------------------------------------------ change page

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponse:
        """The form, with a preview of the next slots (``?preview_from=<ISO time>``)."""
        context = dict(extra_context or {})
        obj = self.get_object(request, unquote(object_id))
        if obj is not None and self.has_view_or_change_permission(request, obj):
            schedule, _ = checked(obj)
            zone = _zone(obj, schedule)
            start, notice = parse_from(request.GET.get("preview_from"), zone)
            slots, problem = preview(obj, start or timezone.now())
            context.update(
                preview_slots=slots, preview_problem=problem, preview_notice=notice,
                preview_zone=str(zone), preview_count=PREVIEW_SLOTS,
                preview_from=start.astimezone(zone).isoformat() if start else None,
                can_run=self.has_run_permission(request),
                run_url=reverse(f"{self.admin_site.name}:anarchon_django_schedule_run",
                                args=[obj.pk]))
        return super().change_view(request, object_id, form_url, context)

    def get_urls(self) -> list[URLPattern]:
        """Django's own pages, and ``<id>/run/`` (POST: run the schedule now)."""
        run = path("<path:object_id>/run/", self.admin_site.admin_view(self.run_now_view),
                   name="anarchon_django_schedule_run")
        return [run, *super().get_urls()]

    def run_now_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """POST: run the schedule now in this process, recorded as manual."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_run_permission(request):
            raise PermissionDenied
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404(f"no schedule with id {object_id!r}")
        self._run(request, obj)
        return HttpResponseRedirect(reverse(
            f"{self.admin_site.name}:anarchon_django_schedule_change", args=[obj.pk]))

    # ------------------------------------------------------------------ actions

    @admin.action(description="Enable the selected schedules", permissions=["change"])
    def enable(self, request: HttpRequest, queryset: QuerySet[ScheduleRow]) -> None:
        """Enable the rows: every worker schedules them within the poll interval."""
        self._set_enabled(request, queryset, enabled=True)

    @admin.action(description="Disable the selected schedules", permissions=["change"])
    def disable(self, request: HttpRequest, queryset: QuerySet[ScheduleRow]) -> None:
        """Disable the rows: every worker drops them within the poll interval."""
        self._set_enabled(request, queryset, enabled=False)

    def _set_enabled(self, request: HttpRequest, queryset: QuerySet[ScheduleRow], *,
                     enabled: bool) -> None:
        changing = queryset.filter(enabled=not enabled)
        rows = list(changing.only("pk", "name"))
        # update() gives the rows a new revision: that is what the workers' polls see.
        count = changing.update(enabled=enabled)
        verb = "enabled" if enabled else "disabled"
        for row in rows:  # the admin's history of each row says who did it
            self.log_change(request, row, [{"changed": {"fields": ["enabled"]}}])
        log.info("%s %s %d schedule(s) in the admin", request.user.get_username(), verb,
                 count)
        poll_s = conf.load().schedules_poll_ms / 1000
        messages.success(request, f"{count} schedule{'s' if count != 1 else ''} {verb}; "
                         f"every worker picks the change up within {poll_s:g} s.")

    @admin.action(description="Run the selected schedules now", permissions=["run"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[ScheduleRow]) -> None:
        """Run each row now in this process (at most :data:`RUN_NOW_LIMIT`)."""
        rows = list(queryset[:RUN_NOW_LIMIT + 1])
        if len(rows) > RUN_NOW_LIMIT:
            messages.error(request, f"Select at most {RUN_NOW_LIMIT} schedules to run now "
                           "(each waits for its run).")
            return
        for row in rows:
            self._run(request, row)

    def _run(self, request: HttpRequest, row: ScheduleRow) -> None:
        # The admin capitalises a message's first letter: the name never comes first.
        if row.name in _declared_names():
            messages.error(request, f"Not run: the name {row.name!r} belongs to a job "
                           "declared in code; run that one from the Jobs page.")
            return
        if not _database_schedules():
            messages.error(request, f"Not run: schedule {row.name!r} is not loaded, "
                           "ANARCHON['DATABASE_SCHEDULES'] is False.")
            return
        if not row.enabled:
            messages.error(request, f"Not run: schedule {row.name!r} is disabled; enable "
                           "it to run it now.")
            return
        _, problem = checked(row)
        if problem is not None:
            messages.error(request, f"Not run: schedule {row.name!r} is not valid: "
                           f"{problem}")
            return
        who = request.user.get_username()
        log.info("%s asked to run schedule %r now", who, row.name)
        result = views.run_now(str(row.name), who=who)
        report_run_now(request, result)
        outcome = (result.run.status if result.run else "could not start" if result.error
                   else "running")
        self.log_change(request, row, f"Ran now ({outcome}).")
