from __future__ import annotations

import time

import httpx
import pytest

from aivitals.agent import Agent, AgentConfig
from aivitals.diagnose import Event, attach
from aivitals.errors import ConfigError


def _wait(cond: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


@pytest.mark.integration
def test_attach_serves_the_latest_diagnosis_on_the_agent_api() -> None:
    config = AgentConfig(listen="127.0.0.1:0", interval=0.5, gpu="none", kernel_log=False)
    agent = Agent(config)
    latest = attach(agent, interval=0.5, window=60.0, alerts=list)
    agent.start()
    try:
        with httpx.Client(base_url=agent.url, timeout=10) as c:
            _wait(lambda: latest() is not None)
            body = c.get("/api/v1/diagnosis").json()
        assert body["status"] == "success"
        assert body["data"]["shape"] in {
            "healthy",
            "widespread_timeouts",
            "intermittent_spikes",
            "unavailable",
            "semantic_anomalies",
        }
        assert "unseen" in body["data"]
    finally:
        agent.stop()


def test_attach_refuses_bad_settings() -> None:
    with pytest.raises(ConfigError, match="interval"):
        attach(object(), interval=0)
    with pytest.raises(ConfigError, match="window"):
        attach(object(), window=-5)


def test_events_of_the_collectors_shape_are_accepted() -> None:
    from aivitals.collect import Event as CollectEvent
    from aivitals.diagnose import diagnose
    from aivitals.tsdb import Store

    ev = CollectEvent(time=999.0, kind="gpu", text="Xid 79 on GPU 0", fields={"xid": "79"})
    d = diagnose(Store(), end=1000.0, window=600.0, events=[ev])
    assert d.events == [Event(999.0, "gpu", "Xid 79 on GPU 0", {"xid": "79"})]
