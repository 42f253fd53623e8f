from __future__ import annotations

import aivitals
from aivitals import errors, signals


def test_all_is_deliberate_and_exported() -> None:
    # The order itself is ruff's RUF022 (isort-style); here: no duplicates, nothing missing.
    for module in (aivitals, errors, signals):
        names = list(module.__all__)
        assert len(names) == len(set(names)), module.__name__
        for name in names:
            assert hasattr(module, name), (module.__name__, name)


def test_every_error_derives_from_the_base() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.AivitalsError)
        assert name in (errors.__doc__ or ""), f"{name} missing from the drawn hierarchy"
