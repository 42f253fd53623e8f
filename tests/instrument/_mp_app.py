"""``uvicorn tests.instrument._mp_app:app --workers 4``: the default registry, multiprocess."""

from __future__ import annotations

from tests.instrument._apps import fastapi_app

app = fastapi_app()
