"""Route templates for the ``route`` label: ``/v1/items/{id}``, never ``/v1/items/42``.

Starlette and FastAPI apps are matched against their own routes (mounts
included, so the template is the full path), once per distinct path: results
for matched paths are cached, so the hot path is one dict lookup. Raw ASGI
apps name their templates in ``InstrumentConfig.routes``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "UNMATCHED",
    "RouteResolver",
    "compile_template",
    "declared_routes",
    "metrics_path_taken",
]

#: The one label value every path no route matched is folded into.
UNMATCHED = "<unmatched>"
#: Methods a raw ASGI app's templates are declared under (it names no methods).
TEMPLATE_METHODS = ("GET", "POST")
#: The most (method, route) pairs declared at zero: a generated router of thousands
#: of routes must not flood the exposition before its first request.
MAX_DECLARED = 256

_PARAM = re.compile(r"{([a-zA-Z_][a-zA-Z0-9_]*)(?::([a-zA-Z_]+))?}")
_CONVERTERS = {"str": "[^/]+", "path": ".*", "int": "[0-9]+", "float": r"[0-9]+(?:\.[0-9]+)?"}
_CONVERTERS["uuid"] = "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
_MAX_CACHE = 4096
_MAX_DEPTH = 16


def compile_template(template: str) -> re.Pattern[str]:
    """A regex matching the paths of a Starlette-style template (``{id}``, ``{p:path}``)."""
    out, last = ["^"], 0
    for match in _PARAM.finditer(template):
        out.append(re.escape(template[last : match.start()]))
        out.append(f"(?:{_CONVERTERS.get(match.group(2) or 'str', '[^/]+')})")
        last = match.end()
    out.append(re.escape(template[last:]) + "$")
    return re.compile("".join(out))


class RouteResolver:
    """Maps a request scope onto its route template, or ``UNMATCHED``."""

    def __init__(self, app: Any, *, templates: Sequence[str] = ()) -> None:
        self._templates = [(t, compile_template(t)) for t in templates]
        self._routes: list[Any] | None = None if templates else _find_routes(app)
        self._cache: dict[str, str] = {}

    def resolve(self, scope: Mapping[str, Any]) -> str:
        path: str = scope["path"]
        hit = self._cache.get(path)
        if hit is not None:
            return hit
        template = self._match(scope)
        if template is None:
            return UNMATCHED  # never cached: a scan of random paths must not fill memory
        if len(self._cache) >= _MAX_CACHE:
            self._cache.clear()
        self._cache[path] = template
        return template

    @property
    def known(self) -> bool:
        """Whether the app's routes can be seen at all (a Starlette router, or templates)."""
        return bool(self._templates) or self._routes is not None

    def serves(self, path: str) -> str | None:
        """The route template that answers ``path`` for any method, or None."""
        scope = {"type": "http", "method": "GET", "path": path, "root_path": ""}
        try:
            return self._match(scope)
        except Exception:  # a route class we do not understand: treated as not serving
            return None

    def _match(self, scope: Mapping[str, Any]) -> str | None:
        if self._routes is not None:
            return _match_starlette(self._routes, dict(scope), "", 0)
        path = scope["path"]
        for template, pattern in self._templates:
            if pattern.match(path):
                return template
        return None


def declared_routes(app: Any, templates: Sequence[str] = ()) -> list[tuple[str, str]]:
    """The (method, route template) pairs ``app`` declares, HEAD left out.

    Starlette/FastAPI routes give their own methods (mounts included, under
    their prefix); a raw app's ``templates`` are declared under GET and POST.
    At most ``MAX_DECLARED`` pairs; a route class we do not understand is skipped.
    """
    out: list[tuple[str, str]] = []
    if templates:
        out = [(m, t) for t in templates for m in TEMPLATE_METHODS]
    else:
        _walk(_find_routes(app) or [], "", 0, out)
    return list(dict.fromkeys(out))[:MAX_DECLARED]


def _walk(routes: list[Any], prefix: str, depth: int, out: list[tuple[str, str]]) -> None:
    for route in list(routes):
        if len(out) >= MAX_DECLARED:
            return
        path = getattr(route, "path", None)
        if not isinstance(path, str):
            continue
        inner = getattr(route, "routes", None)
        if isinstance(inner, list) and depth < _MAX_DEPTH:
            _walk(inner, prefix + path, depth + 1, out)
            continue
        methods = getattr(route, "methods", None)
        if not methods:
            continue  # a websocket route, or one that takes every method
        template = prefix + path if path else prefix or "/"
        out.extend((str(m), template) for m in sorted(methods) if m != "HEAD")


def _find_routes(app: Any) -> list[Any] | None:
    """The route list of the Starlette router under ``app``, through middleware."""
    for _ in range(_MAX_DEPTH):
        router = getattr(app, "router", None)
        routes = getattr(router, "routes", None)
        if routes is None:
            routes = getattr(app, "routes", None)
        if isinstance(routes, list):
            return routes
        inner = getattr(app, "app", None)
        if inner is None or inner is app:
            return None
        app = inner
    return None


def _match_starlette(
    routes: list[Any], scope: dict[str, Any], prefix: str, depth: int
) -> str | None:
    partial: str | None = None
    for route in list(routes):
        try:
            match, child = route.matches(scope)
        except Exception:  # a route class we do not understand must not fail the request
            continue
        name = getattr(match, "name", "NONE")
        if name == "NONE":
            continue
        template = _template_of(route, {**scope, **child}, prefix, depth)
        if name == "FULL":
            return template
        if partial is None:
            partial = template
    return partial


def _template_of(route: Any, scope: dict[str, Any], prefix: str, depth: int) -> str | None:
    path = getattr(route, "path", None)
    inner = getattr(route, "routes", None)
    if isinstance(inner, list) and inner and depth < _MAX_DEPTH:
        # a Mount: the template continues inside it
        found = _match_starlette(inner, scope, prefix + (path or ""), depth + 1)
        if found is not None:
            return found
    if isinstance(path, str):
        return prefix + path if path else prefix or "/"
    return None


def metrics_path_taken(path: str, route: str | None, exposition: str) -> str | None:
    """Why the middleware may not answer ``path``, or None: the app's route ``route``
    (the one that answers ``path``, any method) is that very path's.

    Only a route of exactly this path shadows: a catch-all (``/{path:path}``,
    ``/<path:p>``) or a root mount answers every path, and the exposition in front of it
    is the point. Shared by the ASGI and WSGI middleware, whose refusals must agree.
    """
    if route is None or route.rstrip("/") != path.rstrip("/"):
        return None
    return (
        f"metrics_path {path!r} is a path the app serves already (route {route!r}); "
        f"pass metrics_path= a free path such as '/aivitals/metrics', or None to serve "
        f"the exposition yourself (aivitals.instrument.{exposition})"
    )
