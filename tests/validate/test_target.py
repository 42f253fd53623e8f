"""``ValidateTarget`` names exactly what validate uses of the demo ``Stack``, and the
stack and its parts have every member it names (mypy checks their types: ``_target``)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from aivitals.agent import Agent, AgentConfig
from aivitals.alerts import RuleEngine, RulePack, default_pack
from aivitals.chaos import RunDir
from aivitals.demo import RedisServer, Stack, StackConfig
from aivitals.demo._stack import ServiceProcess
from aivitals.errors import ServiceError
from aivitals.tsdb import Store
from aivitals.validate import (
    TargetAgent,
    TargetConfig,
    TargetEngine,
    TargetLedger,
    TargetPack,
    TargetRedis,
    TargetService,
    ValidateTarget,
)

VALIDATE = Path(__file__).resolve().parents[2] / "src" / "aivitals" / "validate"
#: The nested protocols, by the member of ``ValidateTarget`` that holds them.
NESTED: dict[str, Any] = {
    "config": TargetConfig,
    "service": TargetService,
    "agent": TargetAgent,
    "engine": TargetEngine,
    "pack": TargetPack,
    "redis": TargetRedis,
    "ledger": TargetLedger,
}


def _members(protocol: type) -> set[str]:
    """A protocol's own members: its properties, methods and annotated attributes."""
    own = {n for n in vars(protocol) if not n.startswith("_")}
    return own | {n for n in getattr(protocol, "__annotations__", {}) if not n.startswith("_")}


def _has(obj: object, name: str) -> bool:
    """``name`` on the class or set on the instance (``hasattr`` would run a property)."""
    return hasattr(type(obj), name) or name in vars(obj)


def _is_target(fn: ast.FunctionDef) -> bool:
    """A function whose ``stack`` is the target: a parameter typed ``ValidateTarget``, or
    a local made by ``new_stack`` (other ``stack`` names hold PromQL nodes or a config)."""
    for arg in [*fn.args.args, *fn.args.kwonlyargs]:
        if arg.arg == "stack" and arg.annotation is not None:
            return ast.unparse(arg.annotation) == "ValidateTarget"
    return any(
        isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "stack" for t in n.targets)
        and "new_stack(" in ast.unparse(n.value)
        for n in ast.walk(fn)
    )


def _used_through_stack() -> dict[str, set[str]]:
    """What validate's functions reach through their target ``stack``: ``{"": {"service",
    ...}, "service": {"url", ...}}`` (the second level under the first member's name)."""
    used: dict[str, set[str]] = {"": set()}
    for path in sorted(VALIDATE.glob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(fn, ast.FunctionDef) and _is_target(fn)):
                continue
            for node in ast.walk(fn):
                if not isinstance(node, ast.Attribute):
                    continue
                inner = node.value
                if isinstance(inner, ast.Name) and inner.id == "stack":
                    used[""].add(node.attr)
                elif (
                    isinstance(inner, ast.Attribute)
                    and isinstance(inner.value, ast.Name)
                    and inner.value.id == "stack"
                ):
                    used.setdefault(inner.attr, set()).add(node.attr)
    return used


def test_the_protocol_names_exactly_what_validate_uses_of_the_stack() -> None:
    used = _used_through_stack()
    assert used[""] == _members(ValidateTarget)
    for name, protocol in NESTED.items():
        assert used.get(name, set()) == _members(protocol), name


@pytest.fixture
def stack() -> Any:
    s = Stack(StackConfig(agent=False, quick=True))
    yield s
    s.stop()


def test_the_stack_has_every_member_of_the_protocol(stack: Any) -> None:
    missing = [n for n in _members(ValidateTarget) if not _has(stack, n)]
    assert not missing
    assert all(n in vars(stack) for n in ("agent", "engine", "pack", "redis", "ledger"))


def test_the_stack_s_service_exists_once_it_is_started(stack: Any) -> None:
    with pytest.raises(ServiceError, match="not running"):
        stack.service  # noqa: B018


def test_the_stack_s_parts_have_every_member_of_their_protocols(tmp_path: Path) -> None:
    store = Store()
    pack = default_pack()
    service = ServiceProcess(
        workdir=tmp_path,
        sim_gpu_dir=tmp_path,
        redis_port=None,
        chaos_token="t",
        workers=1,
        queue_size=1,
        request_timeout=1.0,
        port=1,
    )
    parts: dict[str, object] = {
        "config": StackConfig(),
        "service": service,
        "agent": Agent(AgentConfig(), collectors=[]),
        "engine": RuleEngine(store, pack.groups),
        "pack": pack,
        "ledger": RunDir.create(tmp_path / "runs", kind="stack"),
    }
    for name, part in parts.items():
        missing = [n for n in _members(NESTED[name]) if not _has(part, n)]
        assert not missing, (name, missing)
    assert isinstance(parts["pack"], RulePack)
    assert all(hasattr(RedisServer, n) for n in _members(TargetRedis))
