"""The lowest releases the suite is run against are the floors pyproject.toml declares."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / ".ci" / "lowest-constraints.txt"
TOOL_EXTRAS = ("dev", "docs")


def _floors() -> tuple[dict[str, Version], dict[str, Version]]:
    """Lower bounds (``>=``) of the runtime dependencies and of the tool extras', by name.

    The tool extras (``dev``, ``docs``: tests, linters, the docs build) are not what users
    install, so the lowest run does not pin their floors.
    """
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime: dict[str, Version] = {}
    dev: dict[str, Version] = {}
    groups = {"": project["dependencies"], **project["optional-dependencies"]}
    for group, requirements in groups.items():
        for text in requirements:
            req = Requirement(text)
            if canonicalize_name(req.name) == "anarchon":
                continue
            for spec in req.specifier:
                if spec.operator == ">=":
                    target = dev if group in TOOL_EXTRAS else runtime
                    target[canonicalize_name(req.name)] = Version(spec.version)
    return runtime, dev


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for raw in CONSTRAINTS.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==", f"{line!r}: the lowest run pins exact releases"
        pins[canonicalize_name(req.name)] = Version(spec.version)
    return pins


def test_every_runtime_floor_is_what_the_lowest_run_installs() -> None:
    runtime, _ = _floors()
    pins = _pins()
    missing = sorted(set(runtime) - set(pins))
    assert not missing, f"{CONSTRAINTS.name} does not pin the floors of {missing}"
    differ = {name: (runtime[name], pins[name]) for name in runtime
              if runtime[name] != pins[name]}
    assert not differ, f"floor in pyproject.toml vs pin in {CONSTRAINTS.name}: {differ}"


def test_every_pin_of_a_declared_dependency_is_its_floor() -> None:
    # Pins of packages pyproject.toml does not name (what a floor release came with) are
    # allowed; a package it names is pinned at its declared floor.
    runtime, dev = _floors()
    declared = {**dev, **runtime}
    for name, version in _pins().items():
        if name in declared:
            assert declared[name] == version, (
                f"{name}=={version} in {CONSTRAINTS.name}, but pyproject.toml's floor is "
                f"{declared[name]}")
