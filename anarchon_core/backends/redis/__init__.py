"""Redis and Valkey backends (docs/backends/redis.md): see :mod:`.backend` for the options."""

from .backend import (
    Idmp,
    Lease,
    RedisBackend,
    Script,
    StreamId,
    ValkeyBackend,
    parse_info,
    server_label,
)

__all__ = [
    "Idmp", "Lease", "RedisBackend", "Script", "StreamId", "ValkeyBackend", "parse_info",
    "server_label",
]
