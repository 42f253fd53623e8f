"""Stack life-cycle pieces that need no running service (the integration tests of
validate, the soak and the demo start whole stacks)."""

from __future__ import annotations

import pytest

from aivitals.demo import Stack, StackConfig
from aivitals.errors import ServiceError


def test_the_agent_cannot_start_before_the_service() -> None:
    stack = Stack(StackConfig(agent=False, quick=True))
    try:
        with pytest.raises(ServiceError, match="start the stack before its agent"):
            stack.start_agent({"sla_seconds": 0.5})
        # nothing was changed: the config still has no agent and no parameters
        assert stack.config.agent is False and stack.config.rule_params == {}
        assert stack.agent is None
    finally:
        stack.stop()


def test_the_live_diagnosis_holds_for_two_of_the_packs_rate_windows() -> None:
    assert Stack(StackConfig(quick=True)).finding_memory().hold == 16.0
    assert Stack(StackConfig()).finding_memory().hold == 120.0
    # the demo's compressed rules read rates over a minute: their hold is two of those
    compressed = StackConfig(quick=True, rule_params={"rate_window": "60s"})
    assert Stack(compressed).finding_memory().hold == 120.0
