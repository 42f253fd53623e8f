"""The app the real-uvicorn tests serve: ``uvicorn tests.instrument._mp_app:app``.

``AIVITALS_TEST_BARE=1`` serves it without aivitals (the reference behaviour);
``AIVITALS_TEST_LOG=path`` writes the JSON lifecycle logs there.
"""

from __future__ import annotations

import os

from aivitals.instrument import configure_logging
from tests.instrument._apps import fastapi_app

app = fastapi_app(instrumented=not os.environ.get("AIVITALS_TEST_BARE"))

if os.environ.get("AIVITALS_TEST_LOG"):
    configure_logging(os.environ["AIVITALS_TEST_LOG"])
