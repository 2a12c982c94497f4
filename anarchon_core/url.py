"""Backend URLs: ``backend_from_url``, their validation, and the masking of secrets.

Masking (:func:`mask_url`, :func:`redact`) covers every place a credential can sit: the
password of ``user:password@``, a token-only userinfo (``nats://TOKEN@host``), query
parameters such as ``password=``, ``sslpassword=``, ``token=``, ``nkeys_seed=``, and
``key=value`` PostgreSQL conninfo strings. It is pure string work that never raises, so
it is safe on URLs that do not parse. A URL whose userinfo is ambiguous (an unencoded
``/``, ``?``, ``#`` or ``@`` in a password) is masked up to its last ``@``.

Validation (:func:`check_redis_url`, :func:`check_amqp_url`, :func:`check_nats_url`,
:func:`check_postgres_conninfo`) runs when a backend is constructed, so a malformed URL,
an unknown query parameter or a bad value is a :class:`ConfigError` (with the URL masked)
there, never a driver exception at ``start()``.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from .backend import Backend
from .errors import ConfigError

__all__ = [
    "ServerURL", "backend_from_url", "check_amqp_url", "check_nats_url",
    "check_postgres_conninfo", "check_redis_url", "mask_url", "parse_server_url", "redact",
    "url_secrets",
]

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
NAMESPACE_PARAMS = ("prefix", "table", "stream", "strategy", "read_only", "transaction_pooling")
MASK = "***"

# ---------------------------------------------------------------------------- masking

#: Schemes whose userinfo without a colon is (or is often meant as) a secret:
#: ``nats://TOKEN@host``, and ``redis://PASSWORD@host`` as several Redis clients read it.
_TOKEN_SCHEMES = frozenset({"nats", "tls", "ws", "wss", "redis", "rediss", "valkey",
                            "valkeys"})
_SECRET_KEYS = frozenset({
    "password", "pass", "passwd", "pwd", "sslpassword", "ssl_password", "token",
    "auth_token", "access_token", "nkeys_seed", "nkey", "seed", "secret", "client_secret",
    "api_key", "apikey", "jwt", "user_jwt", "credentials", "cadata",
})
_SECRET_WORDS = ("password", "passwd", "secret", "token", "seed")
# key=value pairs in conninfo strings and free text: the value is '...' (with \' escapes)
# or runs to the next space.
_PAIR = re.compile(r"""(?P<key>[A-Za-z_][A-Za-z0-9_]*)(?P<eq>\s*=\s*)"""
                   r"""(?P<value>'(?:[^'\\]|\\.)*'?|[^\s&;#'"]+)""")
_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s'\"<>]+")


def is_secret_param(key: str) -> bool:
    """Whether a query or conninfo parameter named ``key`` holds a credential."""
    lowered = unquote(key).lower()
    return lowered in _SECRET_KEYS or any(word in lowered for word in _SECRET_WORDS)


def _authority_end(rest: str) -> int:
    """Index in ``rest`` (the URL after ``://``) where the authority ends."""
    ends = [i for i in (rest.find(c) for c in "/?#") if i >= 0]
    return min(ends, default=len(rest))


def _split_userinfo(scheme: str, rest: str) -> tuple[str | None, str]:
    """``(userinfo or None, text after the '@')`` of a URL's ``rest``.

    An ``@`` after the end of the authority makes the userinfo ambiguous (an unencoded
    ``/``, ``?`` or ``#`` in the password): everything up to the last ``@`` counts as
    userinfo then, so that masking never shows a piece of the password.
    """
    at = rest.rfind("@")
    if at < 0:
        return None, rest
    return rest[:at], rest[at + 1:]


def _mask_userinfo(scheme: str, userinfo: str, *, ambiguous: bool) -> str:
    if ambiguous:  # no telling where the user name ends: show none of it
        return MASK
    user, colon, _ = userinfo.partition(":")
    if colon:
        return f"{user}:{MASK}"
    return MASK if scheme.lower() in _TOKEN_SCHEMES else user


def _mask_query(query: str) -> str:
    parts = re.split(r"([&;])", query)
    for index in range(0, len(parts), 2):
        key, eq, _ = parts[index].partition("=")
        if eq and is_secret_param(key):
            parts[index] = f"{key}={MASK}"
    return "".join(parts)


def _mask_pairs(text: str) -> str:
    """Mask the secret values of ``key=value`` pairs (conninfo strings, free text)."""

    def repl(match: re.Match[str]) -> str:
        if not is_secret_param(match["key"]):
            return match.group(0)
        return f"{match['key']}{match['eq']}{MASK}"

    return _PAIR.sub(repl, text)


def mask_url(url: object) -> str:
    """Return ``url`` with every credential replaced by ``***`` (safe to log or repr).

    Also takes PostgreSQL ``key=value`` conninfo strings. Never raises.
    """
    text = url if isinstance(url, str) else str(url)
    scheme, sep, rest = text.partition("://")
    if not sep or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.\-]*", scheme):
        return _mask_pairs(text)
    userinfo, after = _split_userinfo(scheme, rest)
    head = ""
    if userinfo is not None:
        ambiguous = len(userinfo) > _authority_end(rest) or "@" in userinfo
        head = _mask_userinfo(scheme, userinfo, ambiguous=ambiguous) + "@"
    path, question, query = after.partition("?")
    if question:
        query, hash_, fragment = query.partition("#")
        after = f"{path}?{_mask_query(query)}{hash_}{fragment}"
    return f"{scheme}://{head}{after}"


def url_secrets(url: object) -> list[str]:
    """Every credential written in ``url`` (as written and percent-decoded), longest first."""
    if not isinstance(url, str):
        return []
    found: set[str] = set()
    scheme, sep, rest = url.partition("://")
    if sep:
        userinfo, after = _split_userinfo(scheme, rest)
        if userinfo is not None:
            user, colon, password = userinfo.partition(":")
            if colon:
                found.add(password)
            elif scheme.lower() in _TOKEN_SCHEMES:
                found.add(user)
            if len(userinfo) > _authority_end(rest) or "@" in userinfo:
                found.update({userinfo, *userinfo.replace(":", "@").split("@")[1:]})
        _, _, query = after.partition("?")
        for pair in re.split(r"[&;]", query.partition("#")[0]):
            key, eq, value = pair.partition("=")
            if eq and is_secret_param(key):
                found.add(value)
    for match in _PAIR.finditer(url):
        if is_secret_param(match["key"]):
            value = match["value"]
            found.update({value, value.strip("'").replace("\\'", "'").replace("\\\\", "\\")})
    found |= {unquote(s) for s in found} | {unquote(s.replace("+", " ")) for s in found}
    return sorted((s for s in found if s), key=len, reverse=True)


def redact(text: str, *urls: object) -> str:
    """``text`` (a driver's error message, say) without any credential of ``urls``.

    Every URL and ``key=value`` pair inside ``text`` is masked as by :func:`mask_url`, and
    every credential found in ``urls`` is replaced by ``***`` wherever it appears.
    """
    text = _URL_IN_TEXT.sub(lambda m: mask_url(m.group(0)), text)
    text = _mask_pairs(text)
    for url in urls:
        for secret in url_secrets(url):
            text = text.replace(secret, MASK)
    return text


# ---------------------------------------------------------------------------- validation

Parser = Callable[[str], object]


def _bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true", "yes", "on", "y"):
        return True
    if lowered in ("0", "false", "no", "off", "n"):
        return False
    raise ValueError("expected true or false")


def _int(low: int, high: int) -> Parser:
    def parse(value: str) -> int:
        if not re.fullmatch(r"[+-]?\d{1,12}", value.strip()) or \
                not low <= int(value) <= high:
            raise ValueError(f"expected a whole number from {low} to {high}")
        return int(value)
    return parse


def _float(low: float, high: float) -> Parser:
    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or not low <= number <= high:
            raise ValueError(f"expected a number from {low:g} to {high:g}")
        return number
    return parse


def _choice(*choices: str) -> Parser:
    def parse(value: str) -> str:
        if value.lower() not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value
    return parse


def _text(value: str) -> str:
    return value


_DAY_S = 86_400.0
_REDIS_PARAMS: dict[str, Parser] = {
    "db": _int(0, 2**31 - 1), "socket_timeout": _float(0.001, _DAY_S),
    "socket_connect_timeout": _float(0.001, _DAY_S), "timeout": _float(0.001, _DAY_S),
    "socket_read_size": _int(1, 2**31 - 1), "socket_keepalive": _bool,
    "retry_on_timeout": _bool, "max_connections": _int(1, 2**31 - 1),
    "health_check_interval": _int(0, 86_400), "ssl_check_hostname": _bool,
    "ssl_min_version": _int(0, 1_000), "protocol": _choice("2", "3"),
    "legacy_responses": _bool, "cluster": _bool, "client_name": _text, "username": _text,
    "password": _text, "ssl_keyfile": _text, "ssl_certfile": _text, "ssl_ca_certs": _text,
    "ssl_ca_path": _text, "ssl_password": _text, "lib_name": _text, "lib_version": _text,
    "ssl_cert_reqs": _choice("none", "optional", "required"),
}
_AMQP_PARAMS: dict[str, Parser] = {
    "heartbeat": _int(0, 65_534), "timeout": _int(1, 86_400), "name": _text,
    "auth": _choice("plain", "amqplain", "external"), "cafile": _text, "capath": _text,
    "cadata": _text, "keyfile": _text, "certfile": _text,
    "no_verify_ssl": _choice("0", "1"), "interleave": _int(0, 1_000),
    "happy_eyeballs_delay": _float(0.0, 3_600.0), "reconnect_interval": _float(0.0, _DAY_S),
    "fail_fast": _bool,
}
_LIBPQ_PARAMS: dict[str, Parser] = {
    "connect_timeout": _int(0, 86_400), "keepalives": _choice("0", "1"),
    "keepalives_idle": _int(0, 2**31 - 1), "keepalives_interval": _int(0, 2**31 - 1),
    "keepalives_count": _int(0, 2**31 - 1), "tcp_user_timeout": _int(0, 2**31 - 1),
    "sslmode": _choice("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": _choice("disable", "prefer", "require"),
    "channel_binding": _choice("disable", "prefer", "require"),
    "target_session_attrs": _choice("any", "read-write", "read-only", "primary", "standby",
                                    "prefer-standby"),
    "load_balance_hosts": _choice("disable", "random"),
    "sslnegotiation": _choice("postgres", "direct"), "sslcompression": _choice("0", "1"),
    "sslsni": _choice("0", "1"), "requiressl": _choice("0", "1"),
}


@dataclass(frozen=True)
class ServerURL:
    """The parts of a validated server URL (query values percent-decoded)."""

    scheme: str
    host: str
    port: int | None
    path: str
    params: dict[str, str] = field(default_factory=dict)


_UNENCODED = ("an '@' in the user name or password, or after the host: percent-encode '@', "
              "'/', '?', '#' and '%' in the user name and password ('/' is %2F, '@' is %40, "
              "'#' is %23, '?' is %3F, '%' is %25)")


def _ambiguous_userinfo(rest: str) -> bool:
    """Whether the userinfo of a URL's ``rest`` has an unencoded ``@``, ``/``, ``?``, ``#``."""
    return rest.count("@", 0, _authority_end(rest)) > 1 or "@" in rest[_authority_end(rest):]


def _fail(kind: str, url: str, reason: str) -> ConfigError:
    return ConfigError(f"invalid {kind} URL {mask_url(url)!r}: {redact(reason, url)}")


def parse_server_url(url: object, *, kind: str, schemes: tuple[str, ...], example: str,
                     params: Mapping[str, Parser], require_host: bool = True) -> ServerURL:
    """Validate ``url`` and return its parts; :class:`ConfigError` with the URL masked.

    Checks the scheme, that the userinfo is percent-encoded, that it parses, that it has a
    host (unless ``require_host``) and a port from 1 to 65535 if any, and that every query
    parameter is one of ``params`` with a value its parser accepts.
    """
    if not isinstance(url, str):
        raise ConfigError(f"invalid {kind} URL of type {type(url).__name__}: expected a string "
                          f"like {example!r}")
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in schemes:
        raise _fail(kind, url, f"expected {' or '.join(s + '://' for s in schemes)}, e.g. "
                               f"{example!r}")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise _fail(kind, url, "it contains spaces or control characters (percent-encode "
                               "them)")
    if _ambiguous_userinfo(rest):
        raise _fail(kind, url, _UNENCODED)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        reason = str(exc)
        if "Port" in reason or "port" in reason:
            reason = "the port must be a number from 1 to 65535"
        raise _fail(kind, url, reason) from None
    if port == 0:
        raise _fail(kind, url, "the port must be a number from 1 to 65535")
    host = parts.hostname or ""
    if require_host and not host:
        raise _fail(kind, url, f"no host: expected e.g. {example!r}")
    found: dict[str, str] = {}
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        parser = params.get(key)
        if parser is None:
            known = ", ".join(sorted(params)) or "none"
            raise _fail(kind, url, f"unknown parameter {key!r} (known: {known})")
        try:
            parser(value)
        except ValueError as exc:
            shown = MASK if is_secret_param(key) else repr(value)
            raise _fail(kind, url, f"invalid value {shown} for parameter {key!r}: {exc}") \
                from None
        found[key] = value
    return ServerURL(parts.scheme.lower(), host, port, parts.path, found)


def check_redis_url(url: object, *, extra: tuple[str, ...] = ()) -> ServerURL:
    """Validate a ``redis://``/``rediss://``/``valkey://``/``valkeys://`` URL.

    The path is empty or a database number (``/0``); query parameters are the
    ``redis.asyncio`` connection arguments anarchon passes through (``socket_timeout``,
    ``ssl_cert_reqs``...), ``cluster``, and the names in ``extra`` (``from_url`` reads
    ``prefix``, ``strategy``... out of the URL and checks their values itself).
    """
    params = {**_REDIS_PARAMS, **dict.fromkeys(extra, _text)}
    parsed = parse_server_url(url, kind="Redis", schemes=("redis", "rediss", "valkey",
                                                          "valkeys"),
                              example="redis://localhost:6379/0", params=params)
    assert isinstance(url, str)
    if not re.fullmatch(r"/?(\d{1,10})?", parsed.path) or \
            (parsed.path.strip("/") and int(parsed.path.strip("/")) > 2**31 - 1):
        raise _fail("Redis", url, f"the path {unquote(parsed.path)!r} is not a database "
                                  "number (expected e.g. /0)")
    return parsed


def check_amqp_url(url: object) -> ServerURL:
    """Validate an ``amqp://``/``amqps://`` URL (the path is the vhost)."""
    return parse_server_url(url, kind="RabbitMQ", schemes=("amqp", "amqps"),
                            example="amqp://localhost:5672/vhost",
                            params=_AMQP_PARAMS)


def check_nats_url(url: object) -> ServerURL:
    """Validate one NATS server URL (``nats://``, ``tls://``, ``ws://``, ``wss://``)."""
    return parse_server_url(url, kind="NATS", schemes=("nats", "tls", "ws", "wss"),
                            example="nats://localhost:4222", params={})


def check_postgres_conninfo(conninfo: str,
                            parse: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    """Validate a PostgreSQL URL or ``key=value`` conninfo; return libpq's parameters.

    ``parse`` is libpq's parser (``psycopg.conninfo.conninfo_to_dict``). On top of it:
    a percent-encoded userinfo, ports from 1 to 65535, and the values of the numeric and
    enumerated parameters (``connect_timeout``, ``sslmode``...) that libpq itself would
    only check when connecting. An empty host is allowed (libpq's default: the Unix
    socket, or ``PGHOST``).
    """
    shown = repr(mask_url(conninfo))

    def fail(reason: str) -> ConfigError:
        return ConfigError(f"invalid PostgreSQL connection string {shown}: "
                           f"{redact(reason, conninfo)}")

    if any(not c.isprintable() and c != " " for c in conninfo):
        raise fail("it contains control characters (percent-encode them in a URL)")
    if "://" in conninfo:
        scheme, _, rest = conninfo.partition("://")
        if scheme.lower() not in ("postgresql", "postgres"):
            raise fail("expected postgresql:// or postgres://")
        if _ambiguous_userinfo(rest):
            raise fail(_UNENCODED)
    try:
        params = parse(conninfo)
    except Exception as exc:  # noqa: BLE001 - libpq's parse errors, re-raised as ConfigError
        raise fail(str(exc).strip()) from None
    for port in str(params.get("port", "")).split(","):
        if port and (not port.isdigit() or not 1 <= int(port) <= 65_535):
            raise fail(f"port {port!r} is not a number from 1 to 65535")
    for key, parser in _LIBPQ_PARAMS.items():
        value = params.get(key)
        if value is not None:
            try:
                parser(str(value))
            except ValueError as exc:
                raise fail(f"invalid value {str(value)!r} for parameter {key!r}: {exc}") \
                    from None
    return params


# ---------------------------------------------------------------------------- namespaces


def split_namespace_params(url: str) -> tuple[str, dict[str, str]]:
    """Remove anarchon's own query parameters (``prefix``, ``table``...) from ``url``."""
    try:
        urlsplit(url)
    except ValueError as exc:
        raise ConfigError(f"invalid backend URL {mask_url(url)!r}: {redact(str(exc), url)}") \
            from None
    # Cut out textually, so the rest of the URL reaches the driver exactly as written.
    base, question, query = url.partition("?")
    query, hash_, fragment = query.partition("#")
    ours: dict[str, str] = {}
    kept: list[str] = []
    for pair in query.split("&") if question else []:
        key, _, value = pair.partition("=")
        name = unquote(key.replace("+", " "))
        if name in NAMESPACE_PARAMS:
            ours[name] = unquote(value.replace("+", " "))
        elif pair:
            kept.append(pair)
    rest = f"{base}?{'&'.join(kept)}" if kept else base
    return f"{rest}{hash_}{fragment}", ours


def backend_from_url(url: str, **options: Any) -> Backend:
    """Build a backend from a URL.

    Schemes: ``redis://``, ``rediss://``, ``valkey://``, ``valkeys://``,
    ``postgresql://``/``postgres://``, ``sqlite:///relative.db`` or
    ``sqlite:////absolute/path.db``, ``amqp://``/``amqps://``, ``nats://``. The query
    parameters ``prefix``, ``table``, ``stream`` and ``strategy`` set those options
    (``redis://host/0?prefix=billing:cron:``); keyword ``options`` override them. An unknown
    scheme, a malformed URL, an unknown query parameter or a bad value is a
    :class:`ConfigError` naming the URL with its credentials masked.
    """
    if not isinstance(url, str) or "://" not in url or \
            not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.\-]*", url.split("://", 1)[0]):
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
    try:
        backend: Backend = cls.from_url(url, **options)
    except TypeError as exc:
        unknown = re.search(r"unexpected keyword argument '([^']*)'", str(exc))
        if unknown is None:
            raise
        raise ConfigError(_unknown_option(cls, unknown.group(1), url)) from None
    return backend


def _unknown_option(cls: type, name: str, url: str) -> str:
    """The error for a keyword option ``cls`` does not take, with the closest valid one."""
    known = [p.name for p in inspect.signature(cls).parameters.values()
             if p.kind is inspect.Parameter.KEYWORD_ONLY]
    close = difflib.get_close_matches(name, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"options: {', '.join(known)}"
    return f"{cls.__name__} has no option {name!r} (for {mask_url(url)!r}); {hint}"
