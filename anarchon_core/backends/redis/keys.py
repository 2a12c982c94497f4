"""Every Redis key anarchon uses, built by one function (the layout is part of the format).

The Keys section of ``docs/backends/redis.md`` documents it for users.

With the ``lease`` strategy all keys of a job share the hash tag ``{<prefix><job>}``, so
Redis Cluster keeps them on one node and each script touches one hash slot::

    {cron:<job>}:state  {cron:<job>}:active  {cron:<job>}:slots
    {cron:<job>}:runs   {cron:<job>}:results

The claim-only strategies use ``<prefix><job>:runs``, ``<prefix><job>:manual`` and
``<prefix><job>:results``; every strategy writes ``<prefix>format`` (the store format)
and ``<prefix>jobs`` (a set of the namespace's job names, for listing them); pausing jobs and
the fleet view write ``<prefix>control`` (a hash of the namespace's control records).

``<job>`` is the job name with ``:``, ``{``, ``}`` and ``%`` escaped as ``%3A``, ``%7B``,
``%7D`` and ``%25`` (:func:`job_key_part`); other names appear as they are. A prefix ends
with ``:`` (enforced by the backend), so the last ``:`` before the part ends the
namespace: prefix ``P:`` with job ``eu:sync`` (``{P:eu%3Async}:state``) and prefix
``P:eu:`` with job ``sync`` (``{P:eu:sync}:state``) never share a key.
"""

from __future__ import annotations

import re
from typing import Literal

__all__ = ["CLAIM_PARTS", "LEASE_PARTS", "Part", "job_from_key_part", "job_key_part", "redis_key"]

Part = Literal["state", "active", "slots", "runs", "results", "manual", "format", "jobs",
               "control"]
#: The keys of one job with the lease strategy, in the order the scripts take them.
LEASE_PARTS: tuple[Part, ...] = ("state", "active", "slots", "runs", "results")
#: The keys of one job with a claim-only strategy.
CLAIM_PARTS: tuple[Part, ...] = ("runs", "manual", "results")


_ESCAPED = {":": "%3A", "{": "%7B", "}": "%7D", "%": "%25"}
_UNESCAPED = {v: k for k, v in _ESCAPED.items()}
_NEEDS_ESCAPE = re.compile(f"[{re.escape(''.join(_ESCAPED))}]")


def job_key_part(job: str) -> str:
    """The job name as it appears in keys: ``:``, ``{``, ``}`` and ``%`` escaped."""
    if _NEEDS_ESCAPE.search(job) is None:
        return job
    return "".join(_ESCAPED.get(c, c) for c in job)


def job_from_key_part(part: str) -> str:
    """Reverse :func:`job_key_part` (key → job name, e.g. to list a namespace's jobs)."""
    if "%" not in part:
        return part
    out, i = [], 0
    while i < len(part):
        code = part[i:i + 3]
        if code in _UNESCAPED:
            out.append(_UNESCAPED[code])
            i += 3
        else:
            out.append(part[i])
            i += 1
    return "".join(out)


def redis_key(prefix: str, part: Part, job: str | None = None, *, tagged: bool = False) -> str:
    """The key of ``part`` for ``job`` in the namespace ``prefix``.

    ``tagged`` wraps ``<prefix><job>`` in a hash tag (the lease layout).
    ``part="format"`` (the namespace's format record), ``part="jobs"`` and
    ``part="control"`` take no job.
    No two (job, part) pairs give the same key: parts hold no ``:`` or ``}``, so the part
    after the last separator decides.
    """
    if part in ("format", "jobs", "control"):
        return f"{prefix}{part}"
    if job is None:
        raise ValueError(f"the {part!r} key belongs to a job")
    name = job_key_part(job)
    return f"{{{prefix}{name}}}:{part}" if tagged else f"{prefix}{name}:{part}"
