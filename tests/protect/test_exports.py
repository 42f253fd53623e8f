from __future__ import annotations

import aivitals.protect as protect


def test_all_is_deliberate_and_exported() -> None:
    names = list(protect.__all__)
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(protect, name), name
    public = {n for n in dir(protect) if not n.startswith("_") and n[0].isupper()}
    assert public <= set(names), public - set(names)
