"""A Django project whose jobs enqueue ``django.tasks`` tasks on the DB task backend.

Run by ``tests/django/test_task_workers.py`` as real ``manage.py anarchon`` processes.
"""
