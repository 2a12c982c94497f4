"""The app config: imports every app's ``jobs.py`` once Django's apps are loaded."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core.signals import setting_changed
from django.utils.module_loading import autodiscover_modules

__all__ = ["AnarchonConfig"]

#: Settings whose change rebuilds the scheduler (``override_settings`` in tests).
_WATCHED = frozenset({"ANARCHON", "DATABASES", "TIME_ZONE"})


class AnarchonConfig(AppConfig):
    """``anarchon_django``: scheduled jobs from every app's ``jobs.py``."""

    name = "anarchon_django"
    verbose_name = "Scheduled jobs"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        """Register the system checks and import each installed app's ``jobs`` module.

        Connects to nothing: the scheduler is built on first use.
        """
        from . import (  # noqa: PLC0415
            checks,  # noqa: F401 - registers the checks
            conf,
            runtime,
            taskresults,
            tasks,
        )

        autodiscover_modules("jobs")
        # ANARCHON['TASKS']: the valid entries now; `check` (E012) reports the others.
        tasks.declare_from_settings(conf.settings_tasks())
        taskresults.connect()
        runtime.mark_ready()
        setting_changed.connect(_settings_changed, dispatch_uid="anarchon_django.reset")


def _settings_changed(*, setting: str, **_: Any) -> None:
    if setting in _WATCHED:
        from . import runtime  # noqa: PLC0415

        runtime.reset()
