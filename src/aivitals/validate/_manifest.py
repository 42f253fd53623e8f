"""A manifest of SHA-256 hashes that freezes a folder of recordings (a test set).

A test set is recorded once, at one code version, and then only read: a figure measured
on it is held out only if nothing was changed after seeing it, and a file edited,
replaced, added or removed since it was recorded would make the figure say something
else. ``write_manifest`` lists every file of the folder with its SHA-256, the code
version the recordings were made at (their ``git_commit``; refused when they differ),
whether the checkout had uncommitted changes when it was frozen, when the recordings
were made and the commands that made them. ``verify_manifest`` refuses the folder,
naming each file, when a listed file is missing or its hash differs, when a file is
not listed, and when there is no manifest at all.

The manifest is ``MANIFEST.sha256``: ``# key: <JSON value>`` header lines, then one
``<sha256>  <file name>`` line per file, so ``sha256sum -c MANIFEST.sha256`` checks the
hashes too (it warns about the header lines and ignores them). Its own hash is the
set's identity, printed with every figure measured on it. ``README.md`` is the one file
not hashed: it documents the set and is rewritten after the run says what it measured;
no benchmark reads it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import StoreError

__all__ = [
    "MANIFEST_FORMAT",
    "MANIFEST_NAME",
    "UNHASHED",
    "GitState",
    "Manifest",
    "ManifestError",
    "file_sha256",
    "verify_manifest",
    "write_manifest",
]

MANIFEST_NAME = "MANIFEST.sha256"
MANIFEST_FORMAT = 1
#: Files of the folder the manifest does not hash: documentation no benchmark reads.
UNHASHED = ("README.md",)
_LINE = re.compile(r"^([0-9a-f]{64})  (\S(?:.*\S)?)$")
_HEADER = re.compile(r"^# ([a-z_]+): (.*)$")


class ManifestError(StoreError):
    """A frozen folder that does not match its manifest, or that cannot be frozen; the
    message names every file concerned."""


@dataclass(frozen=True)
class GitState:
    """The checkout's commit (None outside one), its top folder and its uncommitted
    paths (relative to the top, as ``git status --porcelain`` gives them)."""

    head: str | None
    top: Path | None = None
    dirty: tuple[str, ...] = ()


@dataclass(frozen=True)
class Manifest:
    """A verified (or freshly written) manifest: its path, its own SHA-256, each file's
    hash by name, and the header (``git_commit``, ``git_dirty``, ``commands``...)."""

    path: Path
    sha256: str
    files: Mapping[str, str]
    meta: Mapping[str, Any] = field(default_factory=dict)


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read in chunks (a snapshot can be megabytes)."""
    with Path(path).open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def write_manifest(
    directory: Path,
    *,
    commands: Sequence[str],
    allow_dirty: bool = False,
    outputs: Sequence[Path] = (),
    git: Callable[[Path], GitState] | None = None,
) -> Manifest:
    """Freeze ``directory``: write its ``MANIFEST.sha256`` and return it.

    Refused (``ManifestError``, nothing written) when the folder is not there, already
    has a manifest (a set is frozen once), holds a subfolder or a hidden file (what an
    interrupted save leaves), holds no recording, or a file that is not a recording
    (``load_recordings`` names it); when its recordings were made at more than one code
    version, or at none the checkout can name; and, unless ``allow_dirty``, when the
    checkout's HEAD is not that version or it has uncommitted changes outside the folder
    (the recordings' labels name a commit, not the files the run imported). The folder
    itself and ``outputs`` (the runs' reports) are not code and do not count. With
    ``allow_dirty`` the manifest says ``git_dirty: true`` and lists the paths.
    """
    from ._record import load_recordings

    directory = Path(directory)
    if not directory.is_dir():
        raise ManifestError(f"{directory}: no such folder to freeze")
    manifest = directory / MANIFEST_NAME
    if manifest.exists():
        raise ManifestError(
            f"{manifest} exists: a test set is frozen once (record a new set in a new folder)"
        )
    names = _files(directory)
    recordings = load_recordings(directory)  # refuses a file that is not a recording
    if not recordings:
        raise ManifestError(f"{directory}: no recording to freeze")
    commits: dict[str, list[str]] = {}
    for rec in recordings:
        commits.setdefault(str(rec.meta.get("git_commit")), []).append(rec.name)
    if len(commits) != 1 or "None" in commits:
        versions = ", ".join(f"{c} ({len(n)}: {n[0]}...)" for c, n in sorted(commits.items()))
        raise ManifestError(
            f"{directory}: the recordings are not of one known code version: {versions}"
        )
    [commit] = commits
    state = (git or _git_state)(directory)
    problems = []
    if state.head != commit:
        problems.append(f"the checkout's HEAD is {state.head}, the recordings' {commit}")
    ours = [_relative(p, state.top) for p in (directory, *outputs)]
    dirty = [
        d
        for d in state.dirty
        if not any(o is not None and (d == o or d.startswith(o + "/")) for o in ours)
    ]
    if dirty:
        problems.append(f"uncommitted changes: {', '.join(dirty)}")
    if problems and not allow_dirty:
        raise ManifestError(
            f"{directory}: cannot vouch for the code version ({'; '.join(problems)}); "
            "freeze at the commit that recorded it, or say so with allow_dirty"
        )
    stamps = [float(r.meta["recorded_at"]) for r in recordings if "recorded_at" in r.meta]
    meta: dict[str, Any] = {
        "format": MANIFEST_FORMAT,
        "git_commit": commit,
        "git_dirty": bool(problems),
        "dirty": problems,
        "aivitals_version": sorted({str(r.meta.get("aivitals_version")) for r in recordings}),
        "recorded_from": _iso(min(stamps)) if stamps else None,
        "recorded_to": _iso(max(stamps)) if stamps else None,
        "frozen_at": _iso(time.time()),
        "recordings": len(recordings),
        "commands": list(commands),
    }
    files = {name: file_sha256(directory / name) for name in names}
    text = "".join(f"# {k}: {json.dumps(v, sort_keys=True)}\n" for k, v in meta.items())
    text += "".join(f"{digest}  {name}\n" for name, digest in sorted(files.items()))
    tmp = directory / f".{MANIFEST_NAME}.tmp"
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, manifest)
    except OSError as exc:
        raise ManifestError(f"cannot write {manifest}: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return Manifest(manifest, hashlib.sha256(text.encode()).hexdigest(), files, meta)


def verify_manifest(directory: Path) -> Manifest:
    """Check every file of ``directory`` against its manifest; the manifest when all agree.

    ``ManifestError`` naming each file otherwise: no manifest (the folder is not a
    frozen set), a line that is not ``# key: value`` or ``<sha256>  <name>``, a listed
    file missing, a hash that differs, a file (or folder) the manifest does not list.
    """
    directory = Path(directory)
    manifest = directory / MANIFEST_NAME
    if not directory.is_dir():
        raise ManifestError(f"{directory}: no such test set folder")
    if not manifest.is_file():
        raise ManifestError(f"{manifest} is missing: {directory} is not a frozen test set")
    raw = manifest.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError(f"{manifest}: not UTF-8 text ({exc})") from exc
    files: dict[str, str] = {}
    meta: dict[str, Any] = {}
    for n, line in enumerate(text.splitlines(), 1):
        head, entry = _HEADER.match(line), _LINE.match(line)
        try:
            if head:
                meta[head.group(1)] = json.loads(head.group(2))
                continue
        except json.JSONDecodeError:
            pass
        if entry is None or entry.group(2) in files or "/" in entry.group(2):
            raise ManifestError(f"{manifest}, line {n}: not a '<sha256>  <file>' line: {line!r}")
        files[entry.group(2)] = entry.group(1)
    if not files:
        raise ManifestError(f"{manifest}: lists no file")
    problems = []
    for name, want in sorted(files.items()):
        path = directory / name
        if not path.is_file():
            problems.append(f"{name}: listed, missing")
        elif (got := file_sha256(path)) != want:
            problems.append(f"{name}: SHA-256 {got}, the manifest says {want}")
    present = {p.name for p in directory.iterdir()} - {MANIFEST_NAME, *UNHASHED}
    problems += [f"{name}: not in the manifest" for name in sorted(present - set(files))]
    if problems:
        raise ManifestError(
            f"{directory} does not match {MANIFEST_NAME} (refused): {'; '.join(problems)}"
        )
    return Manifest(manifest, hashlib.sha256(raw).hexdigest(), files, meta)


def _files(directory: Path) -> list[str]:
    """The names to hash: every file but the manifest and ``UNHASHED``; a subfolder or a
    hidden file (an interrupted save's temporary) refuses the freeze."""
    names, odd = [], []
    for path in sorted(directory.iterdir()):
        if path.name in (MANIFEST_NAME, *UNHASHED):
            continue
        if path.name.startswith(".") or not path.is_file() or path.is_symlink():
            odd.append(path.name)
        else:
            names.append(path.name)
    if odd:
        raise ManifestError(
            f"{directory}: not a plain file of the set (a folder, a link or a hidden "
            f"temporary): {', '.join(odd)}"
        )
    return names


def _relative(path: Path, top: Path | None) -> str | None:
    """``path`` relative to the checkout's top, as git names it; None outside it."""
    if top is None:
        return None
    here, top = Path(path).resolve(), top.resolve()
    return here.relative_to(top).as_posix() if here.is_relative_to(top) else None


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git_state(directory: Path) -> GitState:
    """HEAD, the top and the uncommitted paths of the checkout holding ``directory``."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", *args], cwd=directory, capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout if out.returncode == 0 else None

    head = git("rev-parse", "HEAD")
    if head is None:
        return GitState(None)
    # porcelain paths are relative to the top of the checkout, whatever the cwd
    status = git("status", "--porcelain", "--untracked-files=all") or ""
    top = git("rev-parse", "--show-toplevel")
    # untracked folders are listed whole ("dir/"): the trailing slash is not part of a name
    dirty = tuple(
        line[3:].strip('"').rstrip("/") for line in status.splitlines() if line[3:].strip()
    )
    return GitState(head.strip(), Path(top.strip()) if top else None, dirty)
