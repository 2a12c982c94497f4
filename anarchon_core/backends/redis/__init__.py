"""Redis and Valkey backends (SPEC §4.1): see :mod:`.backend` for the options."""

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
