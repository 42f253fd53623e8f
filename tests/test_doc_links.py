"""Every relative link of the Markdown pages points at a file of the checkout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests._paths import REPO

#: ``[text](target)`` and ``![alt](target)``, the target up to a space or ``)``.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
PAGES = sorted(
    [
        REPO / "README.md",
        *REPO.glob("docs/*.md"),
        *REPO.glob("benchmarks/**/*.md"),
        *REPO.glob("tests/fixtures/**/*.md"),
    ]
)


def broken_links(page: Path) -> list[str]:
    """The relative link targets of ``page`` (outside code) that name no file."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    found = []
    for target in LINK.findall(text):
        path = target.split("#", 1)[0]
        if not path or re.match(r"[a-z][a-z0-9+.-]*:", path):  # an anchor, a URL
            continue
        if not (page.parent / path).exists():
            found.append(target)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(page: Path) -> None:
    assert broken_links(page) == []


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("x")
    page.write_text(
        "[ok](there.md) [anchor](#a) [web](https://example.org) [gone](docs/gone.md#x)\n"
        "```\n[in code](not/checked.md)\n```\n"
    )
    assert broken_links(page) == ["docs/gone.md#x"]


def test_the_reference_pages_are_linked_from_the_readme() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    for page in ("docs/architecture.md", "docs/results.md", "docs/history.md"):
        assert f"]({page})" in readme, page
