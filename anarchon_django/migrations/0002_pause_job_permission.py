"""The ``pause_job`` permission: pausing and resuming a job for every worker."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    """Add ``anarchon_django.pause_job`` beside ``run_job``."""

    dependencies = (("anarchon_django", "0001_initial"),)

    operations = (
        migrations.AlterModelOptions(
            name="job",
            options={"verbose_name": "job", "verbose_name_plural": "jobs", "managed": False,
                     "default_permissions": ("view",),
                     "permissions": (("run_job", "Can run a job now"),
                                     ("pause_job",
                                      "Can pause and resume a job for every worker"))},
        ),
    )
