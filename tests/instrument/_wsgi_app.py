"""The Flask app the WSGI tests call in-process and serve with gunicorn.

``gunicorn tests.instrument._wsgi_app:service``. The environment chooses:
``AIVITALS_TEST_LOG`` a JSON log path (``{pid}`` is replaced per worker),
``AIVITALS_TEST_PROTECT=1`` a small guard and a one-slot admission control.
``_wsgi_early.py`` serves the same with a metric made before aivitals is imported.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

from flask import Flask, Response, request
from prometheus_client import REGISTRY, CollectorRegistry

import aivitals
from aivitals.instrument import configure_logging, instrument_wsgi


def flask_app(registry: CollectorRegistry | None = REGISTRY) -> Flask:
    app = Flask(__name__, static_folder=None)

    @app.post("/v1/echo")
    def echo() -> dict[str, int]:
        return {"n": len(request.get_data())}

    @app.get("/v1/items/<int:item_id>")
    def item(item_id: int) -> dict[str, int]:
        return {"id": item_id, "pid": os.getpid()}

    @app.post("/v1/generate")
    def generate() -> dict[str, Any]:
        ids = list(range(len(request.get_data()) // 4 + 1))
        with aivitals.inference(
            model="toy", version="v1.2.0-3-gabcdef1", input_ids=ids, registry=registry
        ) as call:
            time.sleep(0.01)
            call.output_ids([1, 2, 3])
        return {"tokens": 3, "request_id": aivitals.instrument.current_request_id()}

    @app.get("/v1/stream")
    def stream() -> Response:
        def tokens() -> Iterator[str]:
            with aivitals.inference(model="toy", version="v1", input_tokens=2, registry=registry):
                for i in range(3):
                    yield f"tok{i} "

        return Response(tokens(), mimetype="text/plain")

    @app.get("/v1/slow")
    def slow() -> dict[str, int]:
        time.sleep(float(request.args.get("s", "1")))
        return {"pid": os.getpid()}

    @app.get("/v1/boom")
    def boom() -> None:
        raise RuntimeError("boom")

    @app.get("/v1/pid")
    def pid() -> dict[str, int]:
        return {"pid": os.getpid()}

    return app


def _service() -> Any:
    app = flask_app()
    if os.environ.get("AIVITALS_TEST_PROTECT"):
        from aivitals.protect import AdmissionConfig, GuardConfig, protect_wsgi

        admission = AdmissionConfig(
            initial_limit=1, min_limit=1, max_limit=1, adaptive=False, queue_size=0
        )
        guarded = protect_wsgi(app, guard=GuardConfig(max_body_bytes=1000), admission=admission)
        service = instrument_wsgi(guarded)
    else:
        service = instrument_wsgi(app)
    log = os.environ.get("AIVITALS_TEST_LOG")
    if log:
        configure_logging(log.replace("{pid}", str(os.getpid())))
    return service


if os.environ.get("AIVITALS_TEST_SERVE"):
    service = _service()
