"""Automation: ``nox -s tests lint typecheck demo chaos lowest``."""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True
PACKAGES = ["anarchon_core", "anarchon_django", "anarchon_celery", "anarchon_apscheduler"]


@nox.session
def tests(session: nox.Session) -> None:
    """The whole test suite against the real services (see README)."""
    session.install("-e", ".[dev]")
    session.run("pytest", *(session.posargs or ["-n", "2"]))


@nox.session
def lowest(session: nox.Session) -> None:
    """The whole suite against the lowest release of each dependency pyproject.toml admits."""
    session.install("-e", ".[dev]", "-c", ".ci/lowest-constraints.txt")
    session.run("pytest", *(session.posargs or ["-n", "2"]))


@nox.session
def lint(session: nox.Session) -> None:
    """Ruff on everything."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """Mypy --strict on the packages."""
    session.install("-e", ".[dev]")
    session.run("mypy", *[f"-p{p}" for p in PACKAGES])


@nox.session
def demo(session: nox.Session) -> None:
    """``anarchon demo`` on the embedded SQLite store."""
    session.install("-e", ".")
    session.run("anarchon", "demo", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    """The benchmarks (tables on stdout)."""
    session.install("-e", ".[dev]")
    session.run("python", "-m", "bench.core")


@nox.session
def chaos(session: nox.Session) -> None:
    """The chaos harness: ``nox -s chaos -- --backend redis --profile long`` (docs/chaos.md)."""
    session.install("-e", ".[dev]")
    session.run("python", "-m", "chaos.run", *session.posargs)


@nox.session
def browser(session: nox.Session) -> None:
    """The Django admin in Debian's chromium (``apt-get install chromium chromium-driver``).

    Screenshots land in ``artifacts/django-browser/`` (``ANARCHON_ARTIFACTS`` moves them).
    """
    session.install("-e", ".[dev]")
    session.run("pytest", "-m", "browser", "tests/django", *session.posargs)
