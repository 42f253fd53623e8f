"""The temp directory, named without the write that ``tempfile`` probes it with."""

from __future__ import annotations

import os
import tempfile

__all__ = ["temp_root"]


def temp_root() -> str:
    """The directory ``tempfile.gettempdir()`` would name, found without writing.

    Its first call in a process checks each candidate by creating and removing a
    file with a bare random name, so a process killed in that instant leaves the
    file behind. aivitals asks at exit and in helpers that the chaos runner kills,
    where that instant happens.
    """
    if tempfile.tempdir is not None:
        return tempfile.tempdir
    env = [os.environ.get(v) for v in ("TMPDIR", "TEMP", "TMP")]
    for d in [*(e for e in env if e), "/tmp", "/var/tmp", "/usr/tmp"]:
        if os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK):
            return os.path.abspath(d)
    return tempfile.gettempdir()
