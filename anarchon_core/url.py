"""``backend_from_url``: build a backend from a URL, and mask secrets in URLs for logs."""

from __future__ import annotations

import importlib
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from .backend import Backend
from .errors import ConfigError

__all__ = ["backend_from_url", "mask_url"]

# scheme -> (module, class). Each class has ``from_url(url, **options)``.
_SCHEMES: dict[str, tuple[str, str]] = {
    "redis": ("anarchon_core.backends.redis", "RedisBackend"),
    "rediss": ("anarchon_core.backends.redis", "RedisBackend"),
    "valkey": ("anarchon_core.backends.redis", "ValkeyBackend"),
    "valkeys": ("anarchon_core.backends.redis", "ValkeyBackend"),
    "postgresql": ("anarchon_core.backends.postgres", "PostgresBackend"),
    "postgres": ("anarchon_core.backends.postgres", "PostgresBackend"),
    "sqlite": ("anarchon_core.backends.sqlite", "SqliteBackend"),
    "amqp": ("anarchon_core.backends.rabbitmq", "RabbitMQBackend"),
    "amqps": ("anarchon_core.backends.rabbitmq", "RabbitMQBackend"),
    "nats": ("anarchon_core.backends.nats", "NatsBackend"),
    "tls": ("anarchon_core.backends.nats", "NatsBackend"),
}
#: Query parameters anarchon reads out of a URL (the rest stay for the driver).
NAMESPACE_PARAMS = ("prefix", "table", "stream", "strategy")


def mask_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***`` (safe to log or repr)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    query = parts.query
    if query:
        pairs = parse_qsl(query, keep_blank_values=True)
        if any(key.lower() == "password" for key, _ in pairs):
            query = urlencode([(k, "***" if k.lower() == "password" else v) for k, v in pairs],
                              safe="*")
    userinfo, at, hostport = parts.netloc.rpartition("@")
    netloc = parts.netloc
    if at and ":" in userinfo:
        # Kept as written (not re-parsed): a bad port must not make masking raise.
        netloc = f"{userinfo.partition(':')[0]}:***@{hostport}"
    # Replaced in place: urlunsplit would turn "sqlite:////abs.db" into "sqlite://abs.db".
    return url.replace(parts.netloc, netloc, 1).replace(f"?{parts.query}", f"?{query}", 1)


def split_namespace_params(url: str) -> tuple[str, dict[str, str]]:
    """Remove anarchon's own query parameters (``prefix``, ``table``...) from ``url``."""
    parts = urlsplit(url)
    ours: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        (ours.__setitem__(key, value) if key in NAMESPACE_PARAMS else rest.append((key, value)))
    return urlunsplit(parts._replace(query=urlencode(rest, quote_via=quote))), ours


def backend_from_url(url: str, **options: Any) -> Backend:
    """Build a backend from a URL.

    Schemes: ``redis://``, ``rediss://``, ``valkey://``, ``valkeys://``,
    ``postgresql://``/``postgres://``, ``sqlite:///relative.db`` or
    ``sqlite:////absolute/path.db``, ``amqp://``/``amqps://``, ``nats://``. The query
    parameters ``prefix``, ``table``, ``stream`` and ``strategy`` set those options
    (``redis://host/0?prefix=billing:cron:``); keyword ``options`` override them. An unknown
    scheme is a :class:`ConfigError`.
    """
    if not isinstance(url, str) or "://" not in url:
        raise ConfigError(f"invalid backend URL {mask_url(str(url))!r}: expected scheme://...")
    scheme = url.split("://", 1)[0].lower()
    if scheme not in _SCHEMES:
        raise ConfigError(
            f"unknown backend URL scheme {scheme!r} in {mask_url(url)!r}; "
            f"known: {', '.join(sorted(_SCHEMES))}"
        )
    module_name, class_name = _SCHEMES[scheme]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = module_name.rsplit(".", 1)[1]
        raise ConfigError(
            f"{class_name} needs an optional dependency ({exc.name}): "
            f"pip install 'anarchon[{extra}]'"
        ) from None
    cls = getattr(module, class_name)
    backend: Backend = cls.from_url(url, **options)
    return backend
