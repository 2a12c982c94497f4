"""The ``Schedule`` table: jobs kept in the database (unapplying it drops the table)."""

from __future__ import annotations

from django.db import migrations, models

import anarchon_django.models

TARGET_KINDS = [
    ("auto", "auto: a handler, else a django.tasks task, else a Celery task"),
    ("handler", "a handler (@anarchon_django.handler)"),
    ("task", "a django.tasks task"),
    ("celery", "a Celery task"),
]
OVERLAP = [(p, p) for p in ("skip", "allow", "buffer_one", "cancel_other")]
CATCH_UP = [(p, p) for p in ("newest", "all", "none")]


def _ms() -> models.PositiveBigIntegerField:  # type: ignore[type-arg]
    return models.PositiveBigIntegerField(blank=True, null=True)


class Migration(migrations.Migration):
    """Create ``anarchon_django.Schedule``."""

    dependencies = (("anarchon_django", "0002_pause_job_permission"),)

    operations = (
        migrations.CreateModel(
            name="Schedule",
            fields=[
                ("id", models.AutoField(auto_created=True, primary_key=True,
                                        serialize=False, verbose_name="ID")),
                ("name", models.CharField(
                    max_length=200, unique=True,
                    help_text="Unique across the project, like a job declared in code.")),
                ("target_kind", models.CharField("target kind", max_length=10,
                                                 choices=TARGET_KINDS, default="auto")),
                ("target", models.CharField(
                    max_length=300,
                    help_text="A handler's name (@anarchon_django.handler), a django.tasks "
                              "task path (shop.tasks.send_report) or a Celery task name.")),
                ("every", models.CharField(
                    max_length=40, blank=True,
                    help_text='An interval on the epoch grid: "30s", "5m", "1h30m".')),
                ("cron", models.CharField(max_length=200, blank=True,
                                          help_text='A cron expression: "0 8 * * 1-5".')),
                ("tz", models.CharField(
                    "time zone", max_length=64, blank=True,
                    help_text="An IANA zone for cron (empty: the TIME_ZONE setting).")),
                ("dst", models.CharField(
                    "DST rule", max_length=40, blank=True,
                    help_text='For cron: once_first/once_last/both and shift/skip, e.g. '
                              "\"once_last\" (empty: cron(8)'s rule).")),
                ("args", models.JSONField(blank=True, default=list, help_text="A JSON list.")),
                ("kwargs", models.JSONField(blank=True, default=dict,
                                            help_text="A JSON object.")),
                ("task_options", models.JSONField(
                    "task options", blank=True, default=dict,
                    help_text="For a django.tasks task: queue_name, priority, backend. For "
                              "a Celery task: queue, exchange, routing_key, priority, "
                              "headers, expires.")),
                ("timeout_ms", _ms()),
                ("jitter_ms", _ms()),
                ("max_late_ms", _ms()),
                ("overlap", models.CharField(max_length=20, blank=True, choices=OVERLAP)),
                ("max_attempts", models.PositiveIntegerField(blank=True, null=True)),
                ("catch_up_ms", _ms()),
                ("catch_up", models.CharField(max_length=10, blank=True, choices=CATCH_UP)),
                ("enabled", models.BooleanField(default=True)),
                ("one_off", models.BooleanField(
                    "one-off", default=False,
                    help_text="Disabled after its first successful run.")),
                ("start_at", models.DateTimeField(blank=True, null=True,
                                                  help_text="No slot before this time.")),
                ("expires_at", models.DateTimeField(blank=True, null=True,
                                                    help_text="No slot from this time on.")),
                ("description", models.TextField(blank=True)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("updated_at", models.DateTimeField(auto_now=True, db_index=True)),
                ("revision", models.CharField(
                    default=anarchon_django.models.new_revision, editable=False,
                    max_length=32)),
            ],
            options={"verbose_name": "schedule", "verbose_name_plural": "schedules",
                     "ordering": ("name",),
                     "permissions": (("run_schedule", "Can run a schedule now"),)},
        ),
    )
