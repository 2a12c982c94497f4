"""``anarchon doctor module:scheduler``: is this set-up ready to run? One line per check.

The checks, in order: the configuration imports; each job's handler can be imported by
its name; the store answers; its format is one this release reads; the store's clock
against this machine's; the namespace holds what the configuration expects (runs of its
jobs, live instances defining them the same way, not only other jobs). Each line reads
``<check>: ok|warn|FAIL, <what was found>``; the exit status is 1 when a check failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..errors import AnarchonError, StoreFormatError, StoreNotSetUp, StoreUnavailable
from ..models import JobInfo
from ..scheduler import Scheduler

__all__ = ["CLOCK_WARN_MS", "Finding", "check_handler", "check_store", "format_findings",
           "run_checks"]

#: Past this, the clock line warns (the scheduler then schedules by the store's clock).
CLOCK_WARN_MS = 1_000
_CLOCK_SAMPLES = 3


@dataclass(frozen=True)
class Finding:
    """One check's verdict: ``ok``, ``warn`` (worth a look, not a failure) or ``FAIL``."""

    check: str
    verdict: str
    detail: str

    @property
    def failed(self) -> bool:
        """True for a failed check (the command then exits 1)."""
        return self.verdict == "FAIL"

    def __str__(self) -> str:
        return f"{self.check}: {self.verdict}, {self.detail}"


def format_findings(findings: list[Finding]) -> str:
    """The findings, one line each."""
    return "\n".join(str(f) for f in findings)


def _resolve(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def check_handler(job: JobInfo) -> Finding:
    """Whether a job's handler can be imported by its name (as a fresh process would)."""
    label = f"job {job.name}"
    handler = job.handler
    if handler is None:
        return Finding(label, "ok", "claimed by its caller (no handler here)")
    module = getattr(handler, "__module__", None)
    qualname = getattr(handler, "__qualname__", None)
    if not module or not qualname:
        return Finding(label, "warn", f"handler {handler!r} has no importable name")
    name = f"{module}.{qualname}"
    if "<locals>" in qualname or "<lambda>" in qualname:
        return Finding(label, "warn", f"handler {name} is made inside a function: every "
                                      "instance must make it the same way")
    try:
        found = _resolve(module, qualname)
    except Exception as exc:  # noqa: BLE001 - the verdict names what failed
        return Finding(label, "FAIL", f"handler {name} cannot be imported: "
                                      f"{type(exc).__name__}: {exc}")
    if found is not handler and getattr(found, "__wrapped__", None) is not handler:
        return Finding(label, "warn", f"{name} is not the registered handler (replaced "
                                      "after registration?)")
    return Finding(label, "ok", f"handler {name}, {job.schedule}")


async def _clock_offset_ms(reader: Scheduler) -> float:
    """The store's clock minus this machine's (the sample with the shortest round trip)."""
    samples = []
    for _ in range(_CLOCK_SAMPLES):
        before = time.time() * 1000
        store = await reader.backend.clock_ms()
        after = time.time() * 1000
        samples.append((after - before, store - (before + after) / 2))
    return min(samples)[1]


def _namespace(config: list[JobInfo], held: dict[str, Any],
               definitions: dict[str, set[str]] | None) -> Iterator[Finding]:
    names = {j.name for j in config}
    ran = names & set(held)
    others = sorted(set(held) - names)
    if held and not ran:
        yield Finding("namespace", "FAIL",
                      f"it holds runs of {len(held)} other job(s) ({', '.join(sorted(held)[:5])}"
                      f"{', ...' if len(held) > 5 else ''}) and none of this configuration's: "
                      "is the prefix or table the one these instances use?")
        return
    never = sorted(names - set(held))
    detail = f"runs of {len(ran)} of the configuration's {len(names)} job(s)"
    if never:
        detail += f"; never ran here: {', '.join(never)}"
    if others:
        more = " ..." if len(others) > 10 else ""
        detail += f"; other jobs in it: {', '.join(others[:10])}{more}"
    yield Finding("namespace", "ok" if not never and not others else "warn", detail)
    if definitions is None:
        return
    schedules = {j.name: j.schedule for j in config}
    for name, live in sorted(definitions.items()):
        if name in schedules and live and live != {schedules[name]}:
            yield Finding(f"job {name}", "FAIL",
                          f"live instances schedule it as {' / '.join(sorted(live))}, this "
                          f"configuration as {schedules[name]}")


async def check_store(reader: Scheduler, config: list[JobInfo]) -> list[Finding]:
    """The store's checks: reachable, format, clock, namespace (for ``config``'s jobs)."""
    describe = reader.backend.describe()
    findings: list[Finding] = []
    try:
        round_trip = await reader.probe_store()
    except StoreFormatError as exc:
        return [Finding("store", "ok", f"reachable, {describe}"),
                Finding("format", "FAIL", str(exc))]
    except StoreNotSetUp as exc:
        return [Finding("store", "ok", f"reachable, {describe}"),
                Finding("namespace", "FAIL", f"{exc} (no instance has started on it yet, "
                                             "or the prefix or table is not theirs)")]
    except (StoreUnavailable, OSError) as exc:
        return [Finding("store", "FAIL", f"{describe} does not answer: {exc}")]
    findings.append(Finding("store", "ok", f"reachable in {round_trip:.0f} ms, {describe}"))
    offset = await _clock_offset_ms(reader)
    verdict = "ok" if abs(offset) <= CLOCK_WARN_MS else "warn"
    findings.append(Finding("clock", verdict, f"this machine is {-offset:+.0f} ms off the "
                                              "store's clock (leases use the store's)"))
    try:
        held = await reader.job_names()
    except StoreFormatError as exc:
        findings.append(Finding("format", "FAIL", str(exc)))
        return findings
    except StoreNotSetUp as exc:
        findings.append(Finding("namespace", "FAIL", f"{exc} (no instance has started on it "
                                                     "yet, or the prefix or table is not theirs)"))
        return findings
    from ..backend import FORMAT_VERSION  # noqa: PLC0415 - a constant, read here only

    findings.append(Finding("format", "ok", f"readable by this release (format "
                                            f"{FORMAT_VERSION})"))
    definitions: dict[str, set[str]] | None = None
    try:
        view = await reader.status()
    except (AnarchonError, NotImplementedError):  # a store without control records
        view = None
    if view is not None:
        definitions = {j.name: set(j.schedules.values()) for j in view.jobs}
    findings.extend(_namespace(config, held, definitions))
    return findings


def run_checks(scheduler: Scheduler, reader: Scheduler, timeout: float) -> list[Finding]:
    """Every check for ``scheduler``'s jobs, the store's through ``reader`` (its store)."""
    config = scheduler.jobs()
    findings = [check_handler(job) for job in config]

    async def go() -> list[Finding]:
        try:
            return await asyncio.wait_for(check_store(reader, config), timeout)
        except TimeoutError:
            return [Finding("store", "FAIL", f"no answer from {reader.backend.describe()} "
                                             f"within {timeout:g} s (--timeout sets the limit)")]
        finally:
            with contextlib.suppress(Exception):  # closing must not hide the verdicts
                await asyncio.wait_for(reader.stop(), 5)

    return findings + asyncio.run(go())
