"""An app module that makes a prometheus metric of its own before it imports aivitals.

``gunicorn tests.instrument._wsgi_early:service``: with several workers and no
multiprocess directory set beforehand, aivitals cannot switch the mode on in
time for this counter, so it refuses to start with the fix.
"""

from __future__ import annotations

from prometheus_client import Counter

EARLY = Counter("app_early_total", "made before aivitals was imported")
EARLY.inc()

from tests.instrument._wsgi_app import _service  # noqa: E402

service = _service()
