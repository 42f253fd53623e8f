"""Async tests here run on asyncio only.

anyio's pytest plugin runs each ``anyio`` test on every installed backend, and
trio arrives with selenium (the console's browser tests). The middleware under
test is asyncio code (tasks, ``run_in_executor``), as are uvicorn and gunicorn
that serve it, so a trio run would test a setup nobody deploys.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"
