"""The journal's view of the machine: what it finds mounted."""

from __future__ import annotations

from pathlib import Path

from aivitals.chaos._journal import mounted


def test_a_mount_is_found_under_a_symlinked_or_spaced_path(tmp_path: Path) -> None:
    """The kernel lists the canonical path with blanks as octal escapes; a journaled
    target spelt through a symlink, or with a space, must still be found mounted."""
    real = tmp_path / "run dir" / "volume"
    real.mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "run dir")
    escaped = str(real).replace(" ", "\\040")
    table = tmp_path / "mounts"
    table.write_text(f"/dev/loop7 {escaped} ext4 rw,relatime 0 0\n")
    assert mounted(str(real), table=table)
    assert mounted(str(link / "volume"), table=table)
    assert not mounted(str(tmp_path / "elsewhere"), table=table)
    assert not mounted(str(real), table=tmp_path / "no-such-table")
