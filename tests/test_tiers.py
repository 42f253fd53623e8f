"""``make check``'s tests: not none, not all, none that needs more than the venv.

The selection is the Makefile's ``CHECK_SELECT``, run through ``pytest -m`` as
``make check`` runs it; ``tests/_tiers.py`` marks what it leaves out.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests import _servers
from tests._paths import REPO
from tests._tiers import Needs, needs


def check_select() -> str:
    """The ``-m`` expression of ``make check``, from the Makefile."""
    found = re.search(r"^CHECK_SELECT := (.+)$", (REPO / "Makefile").read_text(), re.M)
    assert found, "the Makefile must define CHECK_SELECT"
    return found.group(1).strip()


def tiers(*paths: str) -> dict[str, tuple[str, set[str]]]:
    """node id -> (``check`` or ``rest``, its tier marks), as ``-m CHECK_SELECT`` splits them."""
    argv = ["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "tests._tiers_probe"]
    res = subprocess.run(
        [sys.executable, "-m", "pytest", *argv, "-m", check_select(), *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert res.returncode in (0, 5), (res.stdout + res.stderr)[-4000:]  # 5: none collected
    out: dict[str, tuple[str, set[str]]] = {}
    for line in res.stdout.splitlines():
        if line.startswith("TIER "):
            _, tier, marks, nodeid = line.split(" ", 3)
            out[nodeid] = (tier, set(marks.split(",")) - {"-"})
    return out


def test_check_keeps_the_unit_tests_and_leaves_integration_and_slow_ones_out() -> None:
    got = tiers(
        "tests/test_tiers.py",
        "tests/alerts/test_promtool.py",  # unit, integration and slow tests side by side
        "tests/chaos/test_net.py",  # marked by what its autouse fixture needs: root
        "tests/instrument/test_multiprocess.py",  # one test calls the real promtool
    )
    check = {n for n, (tier, _) in got.items() if tier == "check"}
    rest = set(got) - check
    assert check and rest
    assert not [n for n in check if got[n][1]], "a marked test is in make check"
    assert all(got[n][1] for n in rest), "make check leaves out a test with no tier mark"

    def tier(path: str, name: str) -> tuple[str, set[str]]:
        return got[f"tests/{path}::{name}"]

    assert tier("test_tiers.py", "test_a_helper_that_needs_more_marks_whoever_reaches_it")[0] == (
        "check"
    )
    promtool = "alerts/test_promtool.py"
    assert tier(promtool, "test_every_alert_has_a_firing_and_a_silent_unit_test")[0] == "check"
    slow = "test_the_engine_agrees_with_every_expectation_of_the_unit_tests"
    assert tier(promtool, slow) == ("rest", {"slow"})
    net = [n for n in got if n.startswith("tests/chaos/test_net.py::")]
    assert net and all(got[n] == ("rest", {"integration"}) for n in net)
    multi = "test_dead_workers_keep_counts_but_drop_live_gauges"
    assert tier("instrument/test_multiprocess.py", multi) == ("rest", {"integration"})


@pytest.mark.slow
def test_check_is_most_of_the_suite_and_no_integration_test() -> None:
    got = tiers()
    check = [n for n, (tier, _) in got.items() if tier == "check"]
    assert len(got) > 500
    assert len(got) // 2 <= len(check) < len(got), (len(check), len(got))
    assert not [n for n in check if "integration" in got[n][1]]
    assert not [n for n in check if "slow" in got[n][1]]


# --- the marking, in process ----------------------------------------------------------------


@needs("a thing")
def _needy() -> None:
    pass


def _through_a_helper() -> None:
    _needy()


@contextmanager
def _through_a_context_manager() -> Iterator[None]:
    _through_a_helper()
    yield


class _ThroughAClass:
    def __enter__(self) -> None:
        with _through_a_context_manager():
            pass

    def __exit__(self, *exc: object) -> None:
        pass


class _ThroughAProperty:
    @property
    def started(self) -> bool:
        with _ThroughAClass():
            return True


def _through_a_closure() -> None:
    def inner() -> None:
        assert _ThroughAProperty().started

    inner()


def _through_the_servers_module() -> None:
    _servers.promtool("--version")


def _needs_only_a_port() -> int:
    return _servers.free_port() + len([lambda: 0])


#: What each reaches. The test reads them from here: naming them would mark it too.
REACHES = {
    _needy: "a thing",
    _through_a_helper: "a thing",
    _through_a_context_manager: "a thing",
    _ThroughAClass: "a thing",
    _ThroughAProperty: "a thing",
    _through_a_closure: "a thing",
    _through_the_servers_module: "a Debian package's binary",
    _needs_only_a_port: None,
}


def test_a_helper_that_needs_more_marks_whoever_reaches_it() -> None:
    found = Needs()
    assert {f: found.of(f) for f in REACHES} == REACHES
