"""Record a test set once, freeze it with a manifest of SHA-256 hashes, or verify one.

A test set is held out only if it is made at one code version and then never changed
nor tuned on. ``record DIR`` runs validate's live recording plan into an empty DIR
(every fault at each of its severities, the validated pairs, a soak), then freezes DIR;
``freeze DIR`` writes the manifest of recordings already made (``--command`` says what
made them); ``verify DIR`` checks DIR against its manifest and prints its hash. The
manifest is ``aivitals.validate._manifest``'s: every file's SHA-256, the code version
the recordings were made at, whether the checkout had uncommitted changes, when they
were recorded and by which commands. Only ``benchmarks/diagnosis_accuracy.py
--testset DIR`` diagnoses the set, in its final, reported run.

    .venv/bin/python benchmarks/freeze_testset.py record DIR   # about 70 min, live
    .venv/bin/python benchmarks/freeze_testset.py freeze DIR --command "..." [--allow-dirty]
    .venv/bin/python benchmarks/freeze_testset.py verify DIR

``record`` refuses a DIR that holds anything but a README. validate exits 1 when a check
failed: its recordings are kept (a test set is every case, passed or not); an
interrupted or crashed step stops the plan and nothing is frozen.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from aivitals.errors import AivitalsError
from aivitals.validate import PAIRS
from aivitals.validate._manifest import UNHASHED, verify_manifest, write_manifest

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "benchmarks" / "results" / "runs"
#: The soak of a test set: long enough for the swinging load to turn several times and
#: a model reload to happen, short enough that the whole plan fits about 70 minutes.
SOAK = "15m"


def plan(directory: Path, reports: Path) -> list[list[str]]:
    """validate's commands, in order: the sweep (every fault at each of its severities,
    once at ``single`` for a fault with one magnitude), the pairs, the soak; all quick,
    all recording into ``directory``, their reports into ``reports``."""
    pairs = ",".join("+".join(p) for p in PAIRS)
    base = ["aivitals", "validate", "--quick", "--record", str(directory)]
    return [
        [*base, "--sweep", "--report", str(reports / "testset-sweep.json")],
        [*base, "--scenarios", pairs, "--report", str(reports / "testset-pairs.json")],
        [*base, "--soak", SOAK, "--report", str(reports / "testset-soak.json")],
    ]


def record(
    directory: Path,
    reports: Path = REPORTS,
    run: Callable[[list[str]], int] | None = None,
) -> int:
    """Run the plan into an empty ``directory`` and freeze it; the exit status."""
    directory.mkdir(parents=True, exist_ok=True)
    present = sorted(p.name for p in directory.iterdir() if p.name not in UNHASHED)
    if present:
        print(f"refused: {directory} is not empty ({', '.join(present[:5])}...): "
              "a test set is recorded once, into a fresh folder", file=sys.stderr)  # fmt: skip
        return 2
    reports.mkdir(parents=True, exist_ok=True)
    done = []
    for cmd in plan(directory, reports):
        print("running:", shlex.join(cmd), flush=True)
        rc = (run or _run)(cmd)
        done.append(f"{shlex.join(cmd)} (exit {rc})")
        if rc not in (0, 1):  # 1: a check failed, the recordings stand
            print(f"stopped: exit {rc}; {directory} is not frozen", file=sys.stderr)
            return rc or 1
    outputs = [Path(cmd[-1]) for cmd in plan(directory, reports)]  # each --report
    return freeze(directory, done, allow_dirty=False, outputs=outputs)


def freeze(
    directory: Path, commands: Sequence[str], *, allow_dirty: bool, outputs: Sequence[Path] = ()
) -> int:
    try:
        manifest = write_manifest(
            directory, commands=commands, allow_dirty=allow_dirty, outputs=outputs
        )
    except AivitalsError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {manifest.path}: {len(manifest.files)} files, sha256 {manifest.sha256}")
    return 0


def verify(directory: Path) -> int:
    try:
        manifest = verify_manifest(directory)
    except AivitalsError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    meta = manifest.meta
    print(
        f"{manifest.path}: {len(manifest.files)} files match; sha256 {manifest.sha256}; "
        f"code {meta.get('git_commit')} (dirty: {meta.get('git_dirty')}); "
        f"recorded {meta.get('recorded_from')} .. {meta.get('recorded_to')}"
    )
    return 0


def _run(cmd: list[str]) -> int:
    # the venv's own aivitals, next to this interpreter
    exe = shutil.which(cmd[0], path=str(Path(sys.executable).parent)) or cmd[0]
    proc = subprocess.Popen([exe, *cmd[1:]], cwd=ROOT)
    while True:
        try:
            return proc.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached validate too: it reverts the fault and writes its report
            print("interrupted: waiting for validate to revert", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    rec = sub.add_parser("record", help="run the live plan into an empty DIR, then freeze it")
    rec.add_argument("directory", type=Path, metavar="DIR")
    rec.add_argument("--reports", type=Path, default=REPORTS, help="where validate's reports go")
    fr = sub.add_parser("freeze", help="write DIR's manifest")
    fr.add_argument("directory", type=Path, metavar="DIR")
    fr.add_argument("--command", action="append", default=[], help="what made the recordings")
    fr.add_argument("--allow-dirty", action="store_true", help="say so instead of refusing")
    ve = sub.add_parser("verify", help="check DIR against its manifest")
    ve.add_argument("directory", type=Path, metavar="DIR")
    args = ap.parse_args(argv)
    if args.what == "record":
        return record(args.directory, args.reports)
    if args.what == "freeze":
        if not args.command:
            ap.error("freeze: say what made the recordings with --command")
        return freeze(args.directory, args.command, allow_dirty=args.allow_dirty)
    return verify(args.directory)


if __name__ == "__main__":
    sys.exit(main())
