"""The PostgreSQL lease backend: :class:`PostgresBackend`.

``backend`` holds the backend and its decisions' SQL calls, ``driver`` runs a transaction
of steps on one connection, ``connections`` owns where connections come from.
"""

from .backend import PostgresBackend

__all__ = ["PostgresBackend"]
