"""The runs table for ``ANARCHON['BACKEND'] = "<alias>"``, and the admin's two entries.

The table is created only on the database ``BACKEND`` names, with the core's DDL and the
``TABLE`` setting read when the migration runs; with a URL backend this migration creates
nothing (the store is set up by the backend itself). ``Job`` and ``Run`` are unmanaged:
they have no table (see ``anarchon_django.models``).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models


def create_runs_table(apps: Any, schema_editor: Any) -> None:
    """Create the runs table on the database ``BACKEND`` names (if this is it)."""
    from anarchon_django.db import create_runs_table, migration_target  # noqa: PLC0415

    table = migration_target(schema_editor.connection.alias)
    if table is not None:
        create_runs_table(schema_editor, table)


def drop_runs_table(apps: Any, schema_editor: Any) -> None:
    """Drop the runs table (migrating back to zero)."""
    from anarchon_django.db import drop_runs_table, migration_target  # noqa: PLC0415

    table = migration_target(schema_editor.connection.alias)
    if table is not None:
        drop_runs_table(schema_editor, table)


def _unmanaged(name: str, plural: str, table: str, **extra: Any) -> migrations.CreateModel:
    return migrations.CreateModel(
        name=name.capitalize(),
        fields=[("id", models.AutoField(auto_created=True, primary_key=True, serialize=False,
                                        verbose_name="ID"))],
        options={"verbose_name": name, "verbose_name_plural": plural, "db_table": table,
                 "managed": False, "default_permissions": ("view",), **extra},
    )


class Migration(migrations.Migration):
    """Create the runs table (database backends) and the two unmanaged admin models."""

    initial = True
    dependencies = ()

    operations = (
        _unmanaged("job", "jobs", "anarchon_django_job_no_table",
                   permissions=(("run_job", "Can run a job now"),)),
        _unmanaged("run", "run history", "anarchon_django_run_no_table"),
        migrations.RunPython(create_runs_table, drop_runs_table, elidable=False),
    )
