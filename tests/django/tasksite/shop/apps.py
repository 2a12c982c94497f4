"""The fault hook: ``TASKSITE_FAULT`` kills the process at one enqueue (see settings)."""

from __future__ import annotations

import os
import signal
from typing import Any

from django.apps import AppConfig


class ShopConfig(AppConfig):
    """Connects the fault hook to ``task_enqueued`` when ``TASKSITE_FAULT`` asks for it."""

    name = "tests.django.tasksite.shop"
    label = "tasksite_shop"

    def ready(self) -> None:
        fault = os.environ.get("TASKSITE_FAULT", "")
        if not fault:
            return
        mode, _, count = fault.partition(":")
        at = int(count)
        seen = [0]

        def on_enqueued(sender: Any, task_result: Any, **kwargs: Any) -> None:
            from django.db import transaction  # noqa: PLC0415

            seen[0] += 1
            if seen[0] != at:
                return
            if mode == "between":  # the task row is written, the run's end is not
                os.kill(os.getpid(), signal.SIGKILL)
            else:  # right after both commit
                transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))

        try:
            from django.tasks.signals import task_enqueued  # noqa: PLC0415
        except ImportError:
            from django_tasks.signals import task_enqueued  # noqa: PLC0415
        task_enqueued.connect(on_enqueued, weak=False)
