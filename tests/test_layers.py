"""Layers point one way: every import inside ``src/aivitals`` follows the package
table of docs/architecture.md and uses only other packages' public names.

Two rules, checked on the ``ast`` of every module (lazy imports inside functions
included, string-based ones such as ``cli.py``'s subcommand table not):

- a module never imports another package's private module (``aivitals.x._y``)
  or private name (``from aivitals.x import _y``): a package's API is its
  ``__init__``'s ``__all__``;
- a package imports only what its row's "imports" column lists, and what those
  stand on (the transitive closure: ``protect`` lists ``instrument``, which
  stands on ``signals``); every package may use ``errors``, ``_tempdir`` and
  ``_ports``. ``public APIs`` and ``all`` allow any package; the table is read from
  the doc itself, so a new package needs its row there.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src" / "aivitals"
ARCHITECTURE = REPO / "docs" / "architecture.md"

# Violations that exist today, each fixed by its owner; the test passes with them
# and fails on any new one. Remove an entry when it is fixed (a stale entry is
# harmless: it just no longer matches anything). Keys are (module file, what it imports).
KNOWN: dict[tuple[str, str], str] = {}


def _table() -> dict[str, set[str] | None]:
    """Package -> the packages its row lists (None: any package)."""
    rows: dict[str, str] = {}
    for line in ARCHITECTURE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and (m := re.fullmatch(r"`([a-z_]+)(?:\.py)?`", cells[0])):
            rows[m.group(1)] = cells[2]
    table: dict[str, set[str] | None] = {}
    for name, column in rows.items():
        words = set(re.findall(r"[a-z_]+", column.lower()))
        if {"all", "public"} & words:
            table[name] = None
        else:
            table[name] = words & set(rows)
    return table


def _allowed(table: dict[str, set[str] | None], pkg: str) -> set[str] | None:
    direct = table[pkg]
    if direct is None:
        return None
    seen: set[str] = set()
    todo = list(direct)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        more = table.get(p)
        todo.extend(sorted(more or ()))
    return seen | {"errors", "_tempdir", "_ports"}


def _module_of(path: Path, src: Path) -> tuple[list[str], bool]:
    parts = list(path.relative_to(src.parent).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    return (parts[:-1] if is_pkg else parts), is_pkg


def _imports(path: Path, src: Path) -> list[tuple[int, str]]:
    """Absolute ``aivitals...`` names imported by a module (``module.name`` for from-imports)."""
    parts, is_pkg = _module_of(path, src)
    package = parts if is_pkg else parts[:-1]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            out += [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return [(n, name) for n, name in out if name.split(".")[0] == "aivitals"]


def _is_module(dotted: list[str], src: Path) -> bool:
    base = src.parent.joinpath(*dotted)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def _violations(src: Path = SRC) -> list[tuple[str, str, str]]:
    """(module file, key, description) for every import under ``src`` that breaks a rule."""
    table = _table()
    found: list[tuple[str, str, str]] = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        parts, _ = _module_of(path, src)
        own = parts[1] if len(parts) > 1 else ""  # "" for aivitals/__init__.py
        if own and own not in table:
            if path.name == "__init__.py" and len(parts) == 2:
                found.append((rel, "no row", f"package {own} has no row in docs/architecture.md"))
            allowed = None  # no row to check against; its private imports are still checked
        else:
            allowed = _allowed(table, own) if own else None  # the facade re-exports any API
        for line, name in _imports(path, src):
            dotted = name.split(".")
            if len(dotted) < 2:
                continue
            other = dotted[1]
            if not _is_module(dotted[:2], src):
                continue  # an attribute of the aivitals facade (``__version__``)
            if other == own:
                continue
            # The imported module is the longest prefix that is a module; the rest is a name.
            cut = max(i for i in range(2, len(dotted) + 1) if _is_module(dotted[:i], src))
            private = [p for p in dotted[2:] if p.startswith("_") and not p.startswith("__")]
            if private:
                module = ".".join(dotted[:cut])
                key = module if any(p.startswith("_") for p in dotted[2:cut]) else name
                found.append((rel, key, f"{rel}:{line} imports private {name}"))
            if allowed is not None and other not in allowed:
                found.append(
                    (rel, f"package {other}", f"{rel}:{line}: {own} imports {other} ({name})")
                )
    return found


def test_the_table_is_read_from_the_doc() -> None:
    table = _table()
    assert {"errors", "signals", "instrument", "protect", "collect", "agent", "cli"} <= set(table)
    assert table["protect"] == {"signals", "instrument"}
    assert table["load"] == set() and table["chaos"] is None
    assert _allowed(table, "protect") == {
        "signals",
        "instrument",
        "errors",
        "_tempdir",
        "_ports",
    }
    # The lower layers never reach up to the agent, the store or the diagnosis.
    for low in ("signals", "instrument", "protect", "collect"):
        assert not {"agent", "tsdb", "diagnose", "alerts", "demo"} & (_allowed(table, low) or set())


def test_the_checker_finds_each_kind_of_violation(tmp_path: Path) -> None:
    # A small tree with one import of each kind, so a checker that sees nothing cannot pass.
    src = tmp_path / "aivitals"
    files = {
        "__init__.py": "from . import __version__\n",
        "errors.py": "",
        "signals/__init__.py": "from ..errors import ConfigError\n",
        "signals/_catalogue.py": "",
        "instrument/__init__.py": "from ..signals import Sample\n",
        "instrument/_context.py": "",
        "agent/__init__.py": "",
        "agent/_build.py": "",
        "collect/__init__.py": "from ..signals._catalogue import CATALOGUE\n",
        "collect/_cli.py": (
            "from ..signals import Sample\n"
            "def f():\n"
            "    from ..agent._build import build_collectors\n"  # lazy: still seen
            "    from aivitals.instrument import _private\n"
        ),
        "newpkg/__init__.py": "from ..instrument._context import REQUEST_ID\n",
    }
    for rel, text in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    got = {(rel, key) for rel, key, _ in _violations(src)}
    assert got == {
        ("collect/__init__.py", "aivitals.signals._catalogue"),  # private module
        ("collect/_cli.py", "aivitals.agent._build"),  # private module ...
        ("collect/_cli.py", "package agent"),  # ... and against the table
        ("collect/_cli.py", "package instrument"),  # collect does not stand on instrument
        ("collect/_cli.py", "aivitals.instrument._private"),  # a private name
        ("newpkg/__init__.py", "no row"),
        ("newpkg/__init__.py", "aivitals.instrument._context"),  # checked without a row too
    }


def test_no_new_layer_violations() -> None:
    new = [desc for rel, key, desc in _violations() if (rel, key) not in KNOWN]
    assert not new, (
        "imports against docs/architecture.md (use the other package's public API, "
        "or change the table with a reason):\n" + "\n".join(new)
    )
