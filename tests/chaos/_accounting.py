"""Process accounting for a run of the real CLI: what was there before, what the
run left after (processes, network namespaces, nft tables, temp dirs).

A run is launched under ``_reaper.py`` (a child subreaper: whatever the run
leaves alive, in whatever session, is still its descendant) with its own
``TMPDIR``, chaos root and validate lock under one directory, so "no temp dir
of the run is left" is checkable exactly, and run ids, ports and dirs found in
its output name what belongs to it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from aivitals.chaos._procs import RUN_ENV, start_time

REAPER = Path(__file__).with_name("_reaper.py")


def netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def nft_tables() -> set[str]:
    out = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False)
    return {line.strip() for line in out.stdout.splitlines() if line.startswith("table")}


def processes() -> set[tuple[int, float | None]]:
    return {(p.pid, start_time(p.pid)) for p in psutil.process_iter()}


@dataclass
class Machine:
    """The machine's state a run must leave as it found it."""

    procs: set[tuple[int, float | None]]
    netns: set[str]
    nft: set[str]
    var_tmp: set[str]

    @classmethod
    def now(cls) -> Machine:
        return cls(processes(), netns(), nft_tables(), set(os.listdir("/var/tmp")))


@dataclass
class Dirs:
    """Where one accounted run keeps everything: TMPDIR, chaos root, locks, work."""

    base: Path

    def __post_init__(self) -> None:
        for d in (self.tmp, self.chaos, self.lock, self.work):
            d.mkdir(parents=True, exist_ok=True)

    @property
    def tmp(self) -> Path:
        return self.base / "tmp"

    @property
    def chaos(self) -> Path:
        return self.base / "chaos"

    @property
    def lock(self) -> Path:
        return self.base / "lock"

    @property
    def work(self) -> Path:
        return self.base / "work"

    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            TMPDIR=str(self.tmp),
            AIVITALS_CHAOS_DIR=str(self.chaos),
            AIVITALS_VALIDATE_LOCK=str(self.lock),
            HF_HUB_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
        )


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "aivitals.cli", *args]


@dataclass
class Outcome:
    output: str
    #: exit status of each step, in order
    codes: list[int]
    #: descendants still alive after the run (and its grace) ended
    left: list[dict[str, Any]]
    #: chaos run and stack ledger directories seen while it ran
    runs: list[str]
    killed: bool = False
    extra_ports: set[int] = field(default_factory=set)

    @property
    def ports(self) -> set[int]:
        return {int(p) for p in re.findall(r"127\.0\.0\.1:(\d+)", self.output)} | self.extra_ports


def run_as_user(
    dirs: Dirs, steps: list[dict[str, Any]], *, grace: float = 3.0, timeout: float = 280
) -> Outcome:
    """Run ``steps`` (see ``_reaper``) under the reaper with ``dirs``' environment."""
    spec = json.dumps({"steps": steps, "grace": grace})
    r = subprocess.run(
        [sys.executable, str(REAPER), spec],
        env=dirs.env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    out = r.stdout
    left = json.loads(_tagged(out, "REAPER-LEFT") or "[]")
    runs = json.loads(_tagged(out, "REAPER-RUNS") or "[]")
    codes = [int(c) for c in re.findall(r"^REAPER-EXIT (-?\d+)$", out, re.M)]
    assert r.returncode == 0 and len(codes) == len(steps), out[-4000:]
    return Outcome(out, codes, left, runs, killed="REAPER-SIGKILL" in out)


def _tagged(out: str, tag: str) -> str | None:
    m = re.search(rf"^{tag} (.*)$", out, re.M)
    return m.group(1) if m else None


def leftovers(before: Machine, outcome: Outcome, dirs: Dirs) -> dict[str, Any]:
    """Everything of the run still on the machine (empty when it left nothing)."""
    runs = set(outcome.runs)
    tags = {r[-6:] for r in runs}
    ports = outcome.ports
    base = str(dirs.base)
    strays: list[str] = []
    for p in psutil.process_iter():
        try:
            if (p.pid, start_time(p.pid)) in before.procs or p.status() == psutil.STATUS_ZOMBIE:
                continue
            cmd = " ".join(p.cmdline())
            cwd = p.cwd()
            marker = p.environ().get(RUN_ENV)
        except (psutil.Error, OSError):
            continue
        named = (
            cwd.startswith(base)
            or base in cmd
            or marker in runs
            or any(r in cmd for r in runs)
            or any(re.search(rf"[:\s]{port}\b", cmd) for port in ports)
        )
        if named:
            strays.append(f"pid {p.pid} cwd {cwd}: {cmd[:200]}")
    found: dict[str, Any] = {
        "descendants": outcome.left,
        "processes": strays,
        "netns": sorted(n for n in netns() - before.netns if any(t in n for t in tags)),
        "nft": sorted(t for t in nft_tables() - before.nft if any(g in t for g in tags)),
        "tmp": sorted(str(p) for p in dirs.tmp.rglob("*")),
        # the chaos root keeps only its lock file; the validate lock dir only its lock
        "chaos_root": sorted(p.name for p in dirs.chaos.iterdir() if p.name != "runner.lock"),
        "lock_dir": sorted(
            p.name for p in dirs.lock.iterdir() if p.name != "aivitals-validate.lock"
        ),
        "work": sorted(str(p) for p in dirs.work.rglob("*")),
        "var_tmp": sorted(
            n for n in set(os.listdir("/var/tmp")) - before.var_tmp if any(r in n for r in runs)
        ),
        # disk_fill's volume: mounted under the run dir, so the run id is in its path
        "mounts": sorted(
            line.split()[1]
            for line in Path("/proc/self/mounts").read_text().splitlines()
            if any(r in line for r in runs)
        ),
    }
    return {k: v for k, v in found.items() if v}
