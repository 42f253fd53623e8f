"""Which tier a test runs in: ``make check`` (unit) or only ``make test`` (everything).

The rule:

- ``integration``: the test needs something beyond the venv: a Debian package's
  binary (Prometheus, promtool, Alertmanager, VictoriaMetrics, Redis, stress-ng,
  fio, nft, Chromium), root, or a real server process (the demo stack's too).
- ``slow``: the test takes more than 2 seconds on 2 cores (``--durations`` shows it).
- Every other test is a unit test: ``make check`` runs it (``-m "not integration
  and not slow"``, the Makefile's ``CHECK_SELECT``); ``make test`` runs every test.

``slow`` is written on the test. ``integration`` may be, but mostly it is found
here: a test helper that needs such a thing is decorated with ``@needs(...)``, and
at collection every test that reaches it is marked ``integration`` (with
``needs=`` saying what): called by the test function, by a fixture it uses, or by
a function or class of the test package they call, at any depth.

    @needs("redis-server")
    def start_redis() -> ...: ...
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from types import CodeType, FunctionType, ModuleType
from typing import Any, TypeVar

import pytest

F = TypeVar("F", bound=Callable[..., Any])

_ATTR = "__aivitals_needs__"
#: Functions and classes of these modules are followed into; anything else is a leaf.
_PACKAGE = "tests"


def needs(what: str) -> Callable[[F], F]:
    """Declare that calling the decorated helper needs ``what`` beyond the venv."""

    def declare(fn: F) -> F:
        setattr(fn, _ATTR, what)
        return fn

    return declare


def _ours(obj: object) -> bool:
    """Defined in the test package (or is one of its modules)."""
    attr = "__name__" if isinstance(obj, ModuleType) else "__module__"
    try:
        module = getattr(obj, attr, None) or ""
    except Exception:  # a proxy that only resolves inside its context is not ours
        return False
    return module == _PACKAGE or module.startswith(_PACKAGE + ".")


def _codes(code: CodeType) -> Iterator[CodeType]:
    """A code object and those nested in it (inner functions, lambdas, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _codes(const)


def _referenced(fn: FunctionType) -> Iterator[object]:
    """The globals a function's code names, and the objects in its closure."""
    space = fn.__globals__
    for code in _codes(fn.__code__):
        for name in code.co_names:
            obj = space.get(name)
            if isinstance(obj, ModuleType) and _ours(obj):
                # `_servers.prometheus(...)`: the attribute names are in co_names too
                yield from (getattr(obj, n) for n in code.co_names if hasattr(obj, n))
            elif obj is not None:
                yield obj
    for cell in fn.__closure__ or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue


class Needs:
    """What tests reach, remembered per function: fixtures and helpers are shared."""

    def __init__(self) -> None:
        # by id, with the object kept so that its id stays its own
        self._known: dict[int, tuple[object, str | None]] = {}

    def of(self, obj: object) -> str | None:
        key = id(obj)
        if key not in self._known:
            self._known[key] = (obj, None)  # a cycle ends here
            self._known[key] = (obj, self._find(obj))
        return self._known[key][1]

    def _find(self, obj: object) -> str | None:
        try:
            declared = getattr(obj, _ATTR, None)
        except Exception:  # a proxy (werkzeug's request) that only resolves inside a request
            return None
        if isinstance(declared, str):
            return declared
        if isinstance(obj, staticmethod | classmethod):
            return self.of(obj.__func__)
        if isinstance(obj, property):
            return self.of(obj.fget)
        if not _ours(obj):
            return None
        if inspect.isclass(obj):
            return next((n for n in map(self.of, vars(obj).values()) if n), None)
        fn = inspect.unwrap(obj) if callable(obj) else obj
        if fn is not obj and (found := self.of(fn)):
            return found
        if isinstance(fn, FunctionType):
            return next((n for n in map(self.of, _referenced(fn)) if n), None)
        return None

    def of_item(self, item: pytest.Item) -> str | None:
        if not isinstance(item, pytest.Function):
            return None
        found = self.of(item.function)
        if found:
            return found
        defs = item._fixtureinfo.name2fixturedefs
        for name in item.fixturenames:
            for fixturedef in defs.get(name, ()):
                found = self.of(fixturedef.func)
                if found:
                    return found
        return None


def mark(items: list[pytest.Item]) -> None:
    """Mark ``integration`` every test that reaches a helper declared with ``@needs``."""
    needs_of = Needs()
    for item in items:
        if item.get_closest_marker("integration"):
            continue
        what = needs_of.of_item(item)
        if what:
            item.add_marker(pytest.mark.integration(needs=what))
