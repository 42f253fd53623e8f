"""Comments and docstrings say why, never which run found it.

History lives in commits and ``docs/history.md``; a comment in ``src/`` or ``tests/``
explains the mechanism. This scans every comment and docstring of the Python files under
``src/`` and ``tests/`` (and the comments of the YAML under ``src/``) for four marks of a
story: a commit id (a 7-40 character hex word with a digit and a letter), a CI run named
by its number or by the commit it ran at, a run named by its number, and an ISO date.
String literals are data (test vectors, digests, UUIDs, timestamps) and are not read.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._paths import REPO

#: A word of 7-40 lowercase hex digits with at least one digit and one letter: the short
#: and long forms of a git commit id. Not part of a longer word, a UUID (``-``), a dotted
#: name or a colour (``#``).
COMMIT = re.compile(r"(?<![\w#.-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
#: A CI run named as an event: "CI", up to three words, then "run" and a number, or
#: "at" (the commit it ran at); ``test_marks`` below lists the forms.
CI_RUN = re.compile(r"\bCI(?:'s)?(?: [\w-]+){0,3}? (?:runs? (?:\d+|at\b|of\b)|at\b)")
#: A run referred to by its number (one, a range, or two joined by "and"), not a count
#: of something (seconds, requests, times).
RUN_N = re.compile(
    r"\bruns? \d+(?:-\d+)?(?: and \d+)?(?=[\s,.;:)]|$)"
    r"(?! ?(?:%|x\b|s\b|ms\b|of\b|per\b|times\b|seconds?\b|minutes?\b|hours?\b"
    r"|requests?\b|workers?\b|cases?\b|threads?\b|processes\b|polls?\b|scrapes?\b))"
)
#: An ISO date, or a year and month: four digits of a year, a month, maybe a day.
DATE = re.compile(r"\b(?:19|20)\d\d-(?:0[1-9]|1[0-2])(?:-[0-3]\d)?\b")
MARKS = {"commit id": COMMIT, "CI run": CI_RUN, "run number": RUN_N, "date": DATE}


def marks(text: str) -> Iterator[tuple[str, str]]:
    """Each story mark in a comment's or docstring's ``text``: (kind, the words)."""
    for kind, pattern in MARKS.items():
        for match in pattern.finditer(text):
            yield kind, match.group(0)


def python_prose(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and every string that stands alone as a statement
    (docstrings, ``#:`` and attribute docstrings) in Python ``source``."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            for offset, line in enumerate(node.value.value.splitlines()):
                yield node.lineno + offset, line


def yaml_prose(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment in YAML ``source``: a ``#`` at the start of a line or
    after a blank, outside quotes."""
    for number, line in enumerate(source.splitlines(), 1):
        quote = ""
        for i, char in enumerate(line):
            if quote:
                quote = "" if char == quote else quote
            elif char in "'\"" and (i == 0 or line[i - 1] in " :[{,-"):
                quote = char
            elif char == "#" and (i == 0 or line[i - 1] in " \t"):
                yield number, line[i:]
                break


def findings(path: Path, source: str) -> list[str]:
    """``file:line: kind 'words'`` for every story mark in ``source``'s prose."""
    prose = yaml_prose(source) if path.suffix in (".yaml", ".yml") else python_prose(source)
    found = [(line, kind, words) for line, text in prose for kind, words in marks(text)]
    return [f"{path}:{line}: {kind} {words!r}" for line, kind, words in sorted(found)]


def scanned() -> list[Path]:
    files = [*REPO.glob("src/**/*.py"), *REPO.glob("tests/**/*.py")]
    files += [p for ext in ("yaml", "yml") for p in REPO.glob(f"src/**/*.{ext}")]
    return sorted(files)


def test_comments_and_docstrings_tell_no_stories() -> None:
    found = [
        line
        for path in scanned()
        for line in findings(path.relative_to(REPO), path.read_text(encoding="utf-8"))
    ]
    assert not found, "say why, not which run found it (history: docs/history.md):\n" + (
        "\n".join(found)
    )


def test_the_scan_covers_src_and_tests() -> None:
    names = {p.relative_to(REPO).as_posix() for p in scanned()}
    assert "tests/test_hygiene.py" in names
    assert "src/aivitals/alerts/rules/aivitals-rules.yml" in names
    assert any(n.startswith("src/aivitals/diagnose/signatures/") for n in names)


PLANTED = '''"""Module docstring, fixed in 1ba0282 on 2026-12-04."""

DIGEST = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"  # sha256
UUID = "GPU-0f19b359-80d3-982b-0888-9a84d4c55a92"
STAMP = "2023-11-14T22:13:20.500Z"
COLOUR = "#1f2e3d4c"
ID = "a1b2c3d4e5f6"


def f() -> None:
    """Paged in CI run 25 and again in full run 7."""
    x = 1  # CI at 90740c5 paged here
    y = 2  # the clean-clone CI run saw it, runs 18-21 did not
    z = 3  # 1 of 14 lookups at 0.43; 3 runs of 5 s; sha256 digests are data
'''


def test_the_scanner_finds_planted_stories_and_leaves_data_alone() -> None:
    got = findings(Path("planted.py"), PLANTED)
    assert got == [
        "planted.py:1: commit id '1ba0282'",
        "planted.py:1: date '2026-12-04'",
        "planted.py:11: CI run 'CI run 25'",
        "planted.py:11: run number 'run 25'",
        "planted.py:11: run number 'run 7'",
        "planted.py:12: CI run 'CI at'",
        "planted.py:12: commit id '90740c5'",
        "planted.py:13: run number 'runs 18-21'",
    ], got


@pytest.mark.parametrize(
    ("text", "kinds"),
    [
        ("the CI soak at 90740c5 paged", ["commit id", "CI run"]),
        ("CI's quick run at d625a60", ["commit id", "CI run"]),
        ("measured 2026-12-02 with netloss_counters", ["date"]),
        ("two CI soaks lost requests (1 of 3,467)", []),
        ("a 7-40 character hex word; 3-36 minutes; 0.5-0.62 busy", []),
        ("fail under CI, where it must exercise them", []),
        ("the case still runs three times; it runs 2 workers", []),
        ("decade, accede, defaced: words without digits", []),
        ("1234567 has no letter; 64-char digests are too long", []),
    ],
)
def test_marks(text: str, kinds: list[str]) -> None:
    assert sorted(k for k, _ in marks(text)) == sorted(kinds)


def test_yaml_comments_only() -> None:
    source = (
        "groups:  # fixed at 1ba0282\n"
        "  - expr: 'a # not a comment 2026-12-01'\n"
        '    description: "data 2026-12-01"\n'
        "# CI at 386c9fa\n"
    )
    assert findings(Path("r.yml"), source) == [
        "r.yml:1: commit id '1ba0282'",
        "r.yml:4: CI run 'CI at'",
        "r.yml:4: commit id '386c9fa'",
    ]
