"""ASGI entry point (same in-process option as ``wsgi.py``)."""

from __future__ import annotations

import atexit
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "shop.settings")

application = get_asgi_application()

if os.environ.get("ANARCHON_IN_PROCESS") == "1":
    import anarchon_django

    anarchon_django.start()
    atexit.register(anarchon_django.stop)
