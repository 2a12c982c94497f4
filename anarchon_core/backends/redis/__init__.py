"""Redis and Valkey backends (SPEC §4.1): see :mod:`.backend` for the options."""

from .backend import (
    Idmp,
    Lease,
    RedisBackend,
    RedisClaimOnlyBackend,
    Script,
    StreamId,
    ValkeyBackend,
    ValkeyClaimOnlyBackend,
    parse_info,
    server_label,
)

__all__ = [
    "Idmp", "Lease", "RedisBackend", "RedisClaimOnlyBackend", "Script", "StreamId",
    "ValkeyBackend", "ValkeyClaimOnlyBackend", "parse_info", "server_label",
]
