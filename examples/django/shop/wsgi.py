"""WSGI entry point.

With ``ANARCHON_IN_PROCESS=1`` every web process also runs the scheduler (no separate
``manage.py anarchon`` worker): each slot still runs once across all of them.
"""

from __future__ import annotations

import atexit
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

application = get_wsgi_application()

if os.environ.get("ANARCHON_IN_PROCESS") == "1":
    import anarchon_django

    anarchon_django.start()
    atexit.register(anarchon_django.stop)
