"""Carts, orders and ticks."""

from __future__ import annotations

from django.db import migrations, models


def _id() -> models.BigAutoField:
    return models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                               verbose_name="ID")


class Migration(migrations.Migration):
    """The first tables of the orders app."""

    initial = True
    dependencies = ()

    operations = (
        migrations.CreateModel(
            name="Cart",
            fields=[("id", _id()),
                    ("created_at", models.DateTimeField(auto_now_add=True)),
                    ("expires_at", models.DateTimeField())],
        ),
        migrations.CreateModel(
            name="Order",
            fields=[("id", _id()),
                    ("placed_at", models.DateTimeField(auto_now_add=True)),
                    ("total_cents", models.PositiveIntegerField())],
        ),
        migrations.CreateModel(
            name="Tick",
            fields=[("id", _id()),
                    ("slot", models.BigIntegerField(db_index=True)),
                    ("attempt", models.PositiveIntegerField()),
                    ("runner", models.CharField(max_length=200)),
                    ("done_at", models.DateTimeField(auto_now_add=True))],
        ),
    )
