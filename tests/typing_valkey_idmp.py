"""Checked by mypy in tests/test_redis_backend.py: the lines marked must be type errors."""

from __future__ import annotations

from anarchon_core.backends.redis import Idmp, Lease, RedisBackend, Script, StreamId, ValkeyBackend

RedisBackend(strategy=Idmp(duration_sec=900, max_size=5_000))
RedisBackend(strategy={"name": "idmp", "duration_sec": 900})
RedisBackend(strategy="idmp")
ValkeyBackend(strategy=Lease())
ValkeyBackend(strategy=StreamId())
ValkeyBackend(strategy=Script(window_ms=600_000))
ValkeyBackend(strategy={"name": "script", "window_ms": 600_000})
ValkeyBackend(strategy="stream-id")
ValkeyBackend(strategy=Idmp())  # type error expected
ValkeyBackend(strategy="idmp")  # type error expected
ValkeyBackend(strategy={"name": "idmp"})  # type error expected
RedisBackend(strategy={"name": "lease", "window_ms": 1})  # type error expected
