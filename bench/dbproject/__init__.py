"""The Django project of ``bench.db_schedules``: settings, a no-op handler, a Celery app.

Run by the bench only (``manage.py anarchon`` workers and a ``celery beat``), on the
dedicated PostgreSQL and Redis servers the bench starts; every setting it varies comes
from the environment (see :mod:`bench.dbproject.settings`).
"""
