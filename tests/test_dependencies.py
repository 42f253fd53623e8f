"""Declared dependencies match what the code is tested with.

Every requirement in pyproject.toml (base, extras, build) carries a lower and an
upper bound (or an exact pin), and every installed distribution satisfies its
declared range: a venv that drifted (a newer major installed by hand, a range
edited without reinstalling) fails here rather than somewhere obscure.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _requirements() -> list[tuple[str, Requirement]]:
    project = _pyproject()["project"]
    assert isinstance(project, dict)
    out = [("base", Requirement(r)) for r in project["dependencies"]]
    for extra, reqs in project["optional-dependencies"].items():
        out += [(extra, Requirement(r)) for r in reqs]
    return out


def bounded(spec: SpecifierSet) -> bool:
    """An exact pin, or both a lower bound and an upper bound."""
    ops = {s.operator for s in spec}
    if ops & {"==", "==="}:
        return True
    return bool(ops & {">=", ">", "~="}) and bool(ops & {"<", "<=", "~="})


def test_bounded_accepts_pins_and_ranges_and_refuses_open_ends() -> None:
    assert bounded(SpecifierSet("==2.13.0"))
    assert bounded(SpecifierSet(">=5.24,<6"))
    assert not bounded(SpecifierSet(">=4.44"))
    assert not bounded(SpecifierSet("<6"))
    assert not bounded(SpecifierSet(""))


def test_every_requirement_is_bounded_on_both_sides() -> None:
    build = _pyproject()["build-system"]
    assert isinstance(build, dict)
    reqs = _requirements() + [("build", Requirement(r)) for r in build["requires"]]
    open_ended = [f"{where}: {req}" for where, req in reqs if not bounded(req.specifier)]
    assert open_ended == []


def test_transformers_range_admits_only_the_api_the_demo_uses() -> None:
    # demo/_models.py calls the model with `cache=` and reads `out.cache`: transformers 5
    specs = [req.specifier for _, req in _requirements() if req.name == "transformers"]
    assert specs
    for spec in specs:
        assert not spec.contains("4.57.0")
        assert spec.contains("5.24.0")


def test_torch_stays_pinned_exactly() -> None:
    # any looser spec makes pip fetch a multi-GB CUDA build on the project's machines
    specs = {str(req.specifier) for _, req in _requirements() if req.name == "torch"}
    assert specs == {"==2.13.0"}


@pytest.mark.parametrize(
    ("where", "req"), _requirements(), ids=lambda v: v if isinstance(v, str) else str(v)
)
def test_installed_version_satisfies_the_declared_range(where: str, req: Requirement) -> None:
    if req.marker is not None and not req.marker.evaluate({"extra": where}):
        pytest.skip(f"{req} does not apply on this platform")
    try:
        installed = metadata.version(req.name)
    except metadata.PackageNotFoundError:
        pytest.fail(
            f"{req.name} ({where}) is not installed; the tested environment is "
            "`pip install -e '.[dev,demo,gpu,otel]'` (the Makefile's)"
        )
    # prereleases count as in range when the spec itself names one (0.66b0)
    assert req.specifier.contains(Version(installed), prereleases=True), (
        f"{req.name} {installed} is outside {where}'s {req.specifier}: "
        "reinstall, or move the range with a passing `make test`"
    )
