"""Every Redis key anarchon uses, built by one function (the layout is part of SPEC §4.1).

With the ``lease`` strategy all keys of a job share the hash tag ``{<prefix><job>}``, so
Redis Cluster keeps them on one node and each script touches one hash slot::

    {cron:<job>}:state  {cron:<job>}:active  {cron:<job>}:slots
    {cron:<job>}:runs   {cron:<job>}:results

The claim-only strategies use ``<prefix><job>:runs``, ``<prefix><job>:manual`` and
``<prefix><job>:results``; every strategy writes ``<prefix>format``.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["CLAIM_PARTS", "LEASE_PARTS", "Part", "redis_key"]

Part = Literal["state", "active", "slots", "runs", "results", "manual", "format"]
#: The keys of one job with the lease strategy, in the order the scripts take them.
LEASE_PARTS: tuple[Part, ...] = ("state", "active", "slots", "runs", "results")
#: The keys of one job with a claim-only strategy.
CLAIM_PARTS: tuple[Part, ...] = ("runs", "manual", "results")


def redis_key(prefix: str, part: Part, job: str | None = None, *, tagged: bool = False) -> str:
    """The key of ``part`` for ``job`` in the namespace ``prefix``.

    ``tagged`` wraps ``<prefix><job>`` in a hash tag (the lease layout). ``part="format"``
    is the namespace's format record and takes no job. No two (job, part) pairs give the
    same key: parts hold no ``:`` or ``}``, so the part after the last separator decides.
    """
    if part == "format":
        return f"{prefix}format"
    if job is None:
        raise ValueError(f"the {part!r} key belongs to a job")
    return f"{{{prefix}{job}}}:{part}" if tagged else f"{prefix}{job}:{part}"
