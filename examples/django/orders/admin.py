"""The shop's own models in the admin (anarchon_django adds "Jobs" and "Run history")."""

from __future__ import annotations

from django.contrib import admin

from .models import Cart, Order, Tick

admin.site.register(Cart)
admin.site.register(Order)


@admin.register(Tick)
class TickAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Who ran which slot of the ``tick`` job."""

    list_display = ("slot", "attempt", "runner", "done_at")
