"""The example shop project (settings, URLs, WSGI/ASGI)."""
