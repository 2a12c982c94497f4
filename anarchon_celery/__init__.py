"""Celery beat integration for anarchon (empty until its own issue lands)."""
