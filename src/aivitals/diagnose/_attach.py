"""Run the diagnosis on an agent's clock and serve it at ``/api/v1/diagnosis``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import ConfigError
from ._engine import diagnose
from ._model import Diagnosis

__all__ = ["attach"]


def attach(
    agent: Any,
    *,
    interval: float = 60.0,
    window: float = 1800.0,
    alerts: Callable[[], Sequence[Any]] | None = None,
) -> Callable[[], Diagnosis | None]:
    """Diagnose ``agent.store`` every ``interval`` s with the agent's events and alerts.

    Registers a periodic job (``agent.add_periodic``) and the provider of
    ``/api/v1/diagnosis``; returns a function giving the latest diagnosis.

    **Usage**::

        agent = Agent(AgentConfig(...))
        latest = attach(agent, interval=30, alerts=engine.history)
        agent.start()
    """
    if not interval > 0:
        raise ConfigError(f"attach interval must be > 0 seconds, got {interval!r}")
    if not window > 0:
        raise ConfigError(f"attach window must be > 0 seconds, got {window!r}")
    lock = threading.Lock()
    last: list[Diagnosis] = []

    def run(now: float) -> None:
        d = diagnose(
            agent.store,
            end=now,
            window=window,
            events=agent.events(now - window, now),
            alerts=alerts() if alerts is not None else (),
        )
        with lock:
            last[:] = [d]

    def latest() -> Diagnosis | None:
        with lock:
            return last[0] if last else None

    def provide() -> Any:
        d = latest()
        return d if d is not None else {"status": "no diagnosis yet", "interval": interval}

    agent.add_periodic("diagnose", interval, run)
    agent.set_diagnosis_provider(provide)
    return latest
