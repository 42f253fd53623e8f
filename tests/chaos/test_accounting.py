"""Nothing left running, for every fault and every value of its choice parameters.

Each fault of the fault table runs through the real CLI, as a user runs it
(``aivitals chaos run`` here for every fault and value; ``aivitals validate``
for the non-default values, whose defaults ``tests/validate/test_quick_run.py``
accounts for on one fault of each layer; ``aivitals demo --fault``), under a child
subreaper, and afterwards no process of the run is alive (descendant, cwd in
its dirs, its ports or run ids on the command line, its run marker), no
network namespace or nft table of the run exists, and no temp dir of the run
is left. Every fault that starts or restarts processes is also run with the
runner SIGKILLed mid-fault, followed by ``aivitals chaos cleanup``.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aivitals.chaos import FAULTS
from aivitals.chaos._procs import start_time
from tests._servers import redis_server, require_binary
from tests.chaos._accounting import Dirs, Machine, Outcome, cli, leftovers, run_as_user

pytestmark = [pytest.mark.integration, pytest.mark.slow]

#: Small values, so that a second of each fault costs the shared machine little.
GENTLE: dict[str, dict[str, Any]] = {
    "gpu_oom": {"concurrency": 1, "max_tokens": 4, "prompt_tokens": 64, "fill": 0.5},
    "gpu_cotenant": {"period_seconds": 2, "on_seconds": 1, "share": 0.2},
    "event_loop_blocked": {"seconds": 0.01},
    "connection_flood": {"connections": 20},
    "overlong_inputs": {"rate": 1, "chars": 2000},
    "malformed_inputs": {"rate": 1},
    "cache_stampede": {"interval": 0.5},
    "cpu_burn": {"workers": 1, "load": 20},
    "disk_io_saturation": {"size_mib": 8, "jobs": 1},
    "network_latency": {"delay_ms": 5},
    "traffic_surge": {"factor": 2, "distinct": 8},
    "slow_dependency": {"seconds": 0.05},
    "thread_leak": {"max_threads": 20},
    "disk_fill": {"mib_per_s": 2, "max_mib": 4, "volume_mib": 16},
}


def _cases() -> list[tuple[str, dict[str, int]]]:
    """Every fault, once per combination of its choice values."""
    out = []
    for name, cls in FAULTS.items():
        keys = sorted(cls.choices)
        for values in itertools.product(*(cls.choices[k] for k in keys)):
            out.append((name, dict(zip(keys, values, strict=True))))
    return out


CASES = _cases()
IDS = [n + "".join(f"-{k}{v}" for k, v in c.items()) for n, c in CASES]


def _starts_processes(name: str, choice: dict[str, int]) -> bool:
    return any(t.processes for t in FAULTS[name].touches_for(**choice))


def _needs(name: str, choice: dict[str, int]) -> str | None:
    """Why this machine cannot host the case, or None."""
    netfilter = name in ("network_loss", "network_latency") or (
        name == "redis_down" and choice.get("method") == 0
    )
    if netfilter and (os.geteuid() != 0 or not (shutil.which("ip") and shutil.which("nft"))):
        return "needs root, ip and nft (network namespaces, nftables)"
    if name == "gpu_cotenant" and choice.get("real") == 1 and not shutil.which("nvidia-smi"):
        return "real=1 needs a CUDA GPU"
    return None


@dataclass
class Service:
    """The demo service (and its Redis) that ``chaos run`` faults act on."""

    url: str
    token: str
    pid: int
    sim_gpu_dir: Path
    redis_port: int
    redis_pid: int


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    require_binary("redis-server")
    from aivitals.demo import Stack, StackConfig

    root = tmp_path_factory.mktemp("service-ledger")
    old = os.environ.get("AIVITALS_CHAOS_DIR")
    os.environ["AIVITALS_CHAOS_DIR"] = str(root)
    try:
        stack = Stack(StackConfig(agent=False, quick=True, workers=2)).start()
    finally:
        if old is None:
            os.environ.pop("AIVITALS_CHAOS_DIR", None)
        else:
            os.environ["AIVITALS_CHAOS_DIR"] = old
    try:
        assert stack.service is not None and stack.redis is not None
        assert stack.redis.pid is not None
        yield Service(
            stack.service.url,
            stack.chaos_token,
            stack.service.pid,
            stack.sim_gpu_dir,
            stack.redis.port,
            stack.redis.pid,
        )
    finally:
        stack.stop()


def _chaos_run(
    svc: Service, dirs: Dirs, name: str, choice: dict[str, int], duration: str, *extra: str
) -> list[str]:
    params = {**GENTLE.get(name, {}), **choice}
    argv = cli(
        "chaos", "run", name, "--duration", duration, "--target", svc.url,
        "--token", svc.token, "--service-pid", str(svc.pid),
        "--sim-gpu-dir", str(svc.sim_gpu_dir), "--work-dir", str(dirs.work),
        "--base-rate", "1", *extra,
    )  # fmt: skip
    for k, v in params.items():
        argv += ["-p", f"{k}={v}"]
    return argv


def _redis_args(port: int, pid: int) -> list[str]:
    return ["--redis-port", str(port), "--redis-pid", str(pid)]


def _replacement_pids(out: str) -> list[int]:
    return [int(p) for p in re.findall(r"restarted redis-server on port \d+ as pid (\d+)", out)]


def _assert_clean(before: Machine, outcome: Outcome, dirs: Dirs, *, theirs: set[int]) -> None:
    """Nothing of the run is left, except ``theirs``: a restarted redis-server the
    caller took (--allow-foreign-restart), which the reaper stops afterwards."""
    left = leftovers(before, outcome, dirs)
    desc = left.pop("descendants", [])
    assert {d["pid"] for d in desc} == theirs, (desc, outcome.output[-3000:])
    assert not left, (left, outcome.output[-3000:])


@pytest.mark.parametrize(("name", "choice"), CASES, ids=IDS)
def test_chaos_run_leaves_nothing(
    name: str, choice: dict[str, int], service: Service, tmp_path: Path
) -> None:
    why = _needs(name, choice)
    if why is not None:
        pytest.skip(why)
    dirs = Dirs(tmp_path / "acct")
    steps: list[dict[str, Any]] = []
    foreign = name == "redis_down" and choice.get("method") == 1
    with redis_server() if foreign else _null() as own_redis:
        if foreign:
            # refused for the service's own Redis: the run could not hand it back ...
            svc_redis = _redis_args(service.redis_port, service.redis_pid)
            steps.append({"argv": _chaos_run(service, dirs, name, choice, "1s", *svc_redis)})
            # ... and with --allow-foreign-restart, the new one is the caller's
            mine = _redis_args(own_redis.port, own_redis.proc.pid)
            argv = _chaos_run(service, dirs, name, choice, "1s", *mine, "--allow-foreign-restart")
            steps.append({"argv": argv})
        else:
            redis = _redis_args(service.redis_port, service.redis_pid)
            steps.append({"argv": _chaos_run(service, dirs, name, choice, "1s", *redis)})
        before = Machine.now()
        outcome = run_as_user(dirs, steps)
        if foreign:
            assert outcome.codes == [1, 0], outcome.output[-3000:]
            assert "FaultRefused" in outcome.output and "--allow-foreign-restart" in outcome.output
            assert start_time(service.redis_pid) is not None  # the service's Redis untouched
            theirs = set(_replacement_pids(outcome.output))
            assert len(theirs) == 1, outcome.output[-3000:]
        else:
            assert outcome.codes == [0], outcome.output[-3000:]
            assert f"stopped {name}: reverted" in outcome.output
            theirs = set()
        _assert_clean(before, outcome, dirs, theirs=theirs)


KILL_CASES = [(n, c) for n, c in CASES if _starts_processes(n, c)]
KILL_IDS = [n + "".join(f"-{k}{v}" for k, v in c.items()) for n, c in KILL_CASES]


@pytest.mark.parametrize(("name", "choice"), KILL_CASES, ids=KILL_IDS)
def test_chaos_run_sigkilled_mid_fault_then_cleanup_leaves_nothing(
    name: str, choice: dict[str, int], service: Service, tmp_path: Path
) -> None:
    why = _needs(name, choice)
    if why is not None:
        pytest.skip(why)
    dirs = Dirs(tmp_path / "acct")
    foreign = name == "redis_down" and choice.get("method") == 1
    with redis_server() if foreign else _null() as own_redis:
        if foreign:
            extra = [*_redis_args(own_redis.port, own_redis.proc.pid), "--allow-foreign-restart"]
        else:
            extra = _redis_args(service.redis_port, service.redis_pid)
        argv = _chaos_run(service, dirs, name, choice, "60s", *extra)
        before = Machine.now()
        outcome = run_as_user(
            dirs,
            [
                {"argv": argv, "kill_on": f"started {name}", "kill_after": 0.5, "timeout": 60},
                {"argv": cli("chaos", "cleanup")},
            ],
        )
        assert outcome.killed and outcome.codes[0] == -9, outcome.output[-3000:]
        assert outcome.codes[1] == 0 and "1 run(s) cleaned" in outcome.output, outcome.output
        # cleanup restores a foreign redis-server the run killed: it is the caller's again
        theirs = set(_replacement_pids(outcome.output)) if foreign else set()
        assert len(theirs) == int(foreign), outcome.output[-3000:]
        _assert_clean(before, outcome, dirs, theirs=theirs)


class _null:
    def __enter__(self) -> Any:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# -- validate and demo: the stack owns what a fault restarts --------------------------


def _report(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _non_default_choices() -> list[tuple[str, dict[str, int]]]:
    """Each fault with choices, at every value but the default (the quick run covers those)."""
    out = []
    for name, cls in FAULTS.items():
        for key, values in cls.choices.items():
            for v in values:
                if v != int(cls.params[key][0]):
                    out.append((name, {key: v}))
    return out


def test_validate_with_every_non_default_choice_leaves_nothing(tmp_path: Path) -> None:
    require_binary("redis-server")
    dirs = Dirs(tmp_path / "acct")
    cases = _non_default_choices()
    names = sorted({n for n, _ in cases})
    report = dirs.base / "report.json"
    argv = cli(
        "validate", "--quick", "--scenarios", ",".join(names), "--report", str(report),
        "--baseline", "1", "--fault-max", "5", "--recover-max", "1",
    )  # fmt: skip
    for name, choice in cases:
        argv += [f"-p{name}.{k}={v}" for k, v in choice.items()]
    before = Machine.now()
    outcome = run_as_user(dirs, [{"argv": argv, "timeout": 240}], timeout=280)
    data = _report(report)
    env = data["environment"]
    outcome.extra_ports |= {int(u.rsplit(":", 1)[1].split("/")[0]) for u in
                            (env["service"], env["redis"])}  # fmt: skip
    by_fault = {s["fault"]: s for s in data["scenarios"]}
    redis = by_fault["redis_down"]
    revert = [c for c in redis["checks"] if c["name"] == "revert"]
    # the restarted redis-server went back to the stack, which stopped it at the end
    assert revert and "handed to its owner" in revert[0]["text"], redis
    for name, choice in cases:
        why = _needs(name, choice)
        if why is None:
            assert by_fault[name]["error"] is None, by_fault[name]
        elif name == "gpu_cotenant":  # refused up front without CUDA: nothing was started
            assert "CUDA" in (by_fault[name]["error"] or ""), by_fault[name]
    assert not leftovers(before, outcome, dirs), leftovers(before, outcome, dirs)


def test_validate_sigkilled_mid_restart_fault_then_cleanup_leaves_nothing(tmp_path: Path) -> None:
    require_binary("redis-server")
    dirs = Dirs(tmp_path / "acct")
    argv = cli(
        "validate", "--quick", "--scenarios", "redis_down", "-p", "redis_down.method=1",
        "--report", str(dirs.base / "report.json"), "--baseline", "1", "--fault-max", "30",
    )  # fmt: skip
    before = Machine.now()
    outcome = run_as_user(
        dirs,
        [
            # the redis-server is killed, not yet restarted: the journal holds the restart
            {
                "argv": argv,
                "kill_on_journal": '"kind": "restart"',
                "kill_after": 0.5,
                "timeout": 200,
            },
            {"argv": cli("chaos", "cleanup")},
        ],
        timeout=260,
    )
    assert outcome.killed and outcome.codes[0] == -9, outcome.output[-3000:]
    # the stack's ledger and the chaos run: both cleaned; the dead stack's Redis is
    # not restarted (no one would stop it)
    assert "2 run(s) cleaned" in outcome.output, outcome.output[-3000:]
    assert "restarted" not in outcome.output
    assert not leftovers(before, outcome, dirs), leftovers(before, outcome, dirs)


@pytest.mark.parametrize("kill_signal", ["SIGINT", "SIGTERM"])
def test_a_sweep_stopped_by_ctrl_c_reverts_everything_and_writes_the_partial_report(
    tmp_path: Path, kill_signal: str
) -> None:
    """Ctrl-C, or SIGTERM as a supervisor sends it (the chaos runner's own SIGTERM handler
    once exited 143 with no report)."""
    require_binary("redis-server")
    dirs = Dirs(tmp_path / "acct")
    report = dirs.base / "report.json"
    argv = cli(
        "validate", "--quick", "--sweep", "--scenarios", "cpu_burn", "--report", str(report),
        "--baseline", "1", "--fault-max", "8", "--recover-max", "5",
    )  # fmt: skip
    before = Machine.now()
    # Ctrl-C in the second case's fault phase (its baseline is 1 s)
    step = {"argv": argv, "kill_on": "== cpu_burn@moderate", "kill_after": 4.0}
    outcome = run_as_user(dirs, [{**step, "kill_signal": kill_signal, "timeout": 240}], timeout=280)
    assert outcome.codes == [130], outcome.output[-3000:]
    assert "interrupted: every fault reverted" in outcome.output, outcome.output[-3000:]
    data = _report(report)
    env = data["environment"]
    outcome.extra_ports |= {int(u.rsplit(":", 1)[1].split("/")[0]) for u in
                            (env["service"], env["redis"])}  # fmt: skip
    assert data["interrupted"] is True and data["passed"] is False
    assert data["planned"] == 3 and "interrupted after 2 of 3 cases" in data["summary"]
    first, cut = data["scenarios"]
    assert first["fault"] == "cpu_burn@threshold" and first["error"] is None and first["checks"]
    assert cut["fault"] == "cpu_burn@moderate" and cut["error"] == "interrupted", cut
    assert not leftovers(before, outcome, dirs), leftovers(before, outcome, dirs)


def test_demo_with_a_fault_leaves_nothing(tmp_path: Path) -> None:
    require_binary("redis-server")
    dirs = Dirs(tmp_path / "acct")
    argv = cli(
        "demo", "--fault", "redis_down", "--fault-after", "1", "--fault-duration", "2",
        "--duration", "6", "--probe-seconds", "1",
    )  # fmt: skip
    if _needs("redis_down", {"method": 0}) is not None:
        argv[argv.index("redis_down")] = "cache_stampede"
    before = Machine.now()
    outcome = run_as_user(dirs, [{"argv": argv, "timeout": 200}], timeout=260)
    assert outcome.codes == [0], outcome.output[-3000:]
    assert not leftovers(before, outcome, dirs), leftovers(before, outcome, dirs)
