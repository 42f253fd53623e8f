"""The client faults send what the request template says (``FaultContext.request``)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from aivitals.chaos import FaultContext
from aivitals.chaos._cli import chaos
from aivitals.chaos._clients import MALFORMED_BODIES, malformed_requests
from aivitals.errors import ConfigError
from aivitals.load import DEMO_EMBEDDINGS, RequestSpec, RequestTemplate, embeddings_request
from tests.chaos.conftest import run_processes
from tests.load._server import TinyServer, tiny_server

#: A service unlike the demo: its own path, an auth header, the prompt inside a longer
#: string of a nested body.
USER = RequestTemplate(
    "PUT",
    "/api/embed",
    {"model": "m", "req": {"text": "Embed: {{prompt}}"}},
    (("Content-Type", "application/json"), ("Authorization", "Bearer t0k")),
)


def _wait(cond: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def _sent(runner_factory: Any, srv: TinyServer, name: str, n: int, **params: Any) -> None:
    ctx = FaultContext(target=srv.url, base_rate=10, request=USER)
    with runner_factory(ctx) as runner:
        active = runner.start(name, duration=20, **params)
        assert _wait(lambda: len(srv.bodies) >= n)
        runner.stop(active)
        assert run_processes(runner.run.run_id) == []


def _user_requests(srv: TinyServer) -> None:
    assert set(srv.paths) == {"/api/embed"}
    for head in srv.heads:
        assert head[0] == "PUT"
        assert "Authorization: Bearer t0k" in head


def test_the_demo_s_malformed_inputs_are_the_bytes_sent_before_the_template() -> None:
    """Pinned: the live fault drill's InputRejectionsHigh grading counts these."""
    assert (
        b'{"input": "hello \\u0000\\u0001\\u0002 world \\u001b[31m"}',
        b'{"input": "caf\xc3 \xff\xfe invalid utf-8 \xed\xa0\x80"}',
        '{"input": "\uff11\uff12\uff13 full-width digits"}'.encode(),
        b'{"input": "\x07\x08 raw control chars \x0b\x0c"}',
        b'{"input": "truncated',
    ) == MALFORMED_BODIES
    json_header = (("Content-Type", "application/json"),)
    assert malformed_requests(DEMO_EMBEDDINGS) == [
        RequestSpec("POST", "/v1/embeddings", b, json_header) for b in MALFORMED_BODIES
    ]


def test_malformed_inputs_keep_their_kinds_in_a_user_s_template() -> None:
    bodies = [s.body for s in malformed_requests(USER)]
    head = b'{"model": "m", "req": {"text": "Embed: '
    assert all(b.startswith(head) for b in bodies)
    assert json.loads(bodies[0])["req"]["text"] == "Embed: hello \x00\x01\x02 world \x1b[31m"
    assert bodies[1] == head + b'caf\xc3 \xff\xfe invalid utf-8 \xed\xa0\x80"}}'
    assert bodies[4] == head + b"truncated"


def test_the_default_context_sends_the_demo_s_request() -> None:
    assert FaultContext().request == DEMO_EMBEDDINGS


@pytest.mark.parametrize(
    "name,params,check",
    [
        (
            "overlong_inputs",
            {"chars": 5000, "rate": 50},
            lambda bodies, sizes: max(sizes) > 5000 and bodies[0].startswith(b'{"model": "m"'),
        ),
        (
            "malformed_inputs",
            {"rate": 100},
            lambda bodies, sizes: (
                any(b"\xff" in b for b in bodies)
                and any(b.endswith(b"Embed: truncated") for b in bodies)
            ),
        ),
        (
            "traffic_surge",
            {"factor": 10},
            lambda bodies, sizes: (
                len(set(bodies)) == len(bodies)  # a new prompt each
                and all(json.loads(b)["req"]["text"].startswith("Embed: ") for b in bodies)
            ),
        ),
        (
            "traffic_surge",
            {"factor": 10, "distinct": 2},
            lambda bodies, sizes: len(set(bodies)) == 2,
        ),
    ],
)
def test_client_faults_send_the_template_s_request(
    name: str, params: dict[str, Any], check: Any, runner_factory: Any
) -> None:
    with tiny_server() as srv:
        _sent(runner_factory, srv, name, 8, **params)
        _user_requests(srv)
        assert check(srv.bodies, srv.sizes)


def test_a_surge_of_streaming_completions_is_the_demo_s_only(runner_factory: Any) -> None:
    with tiny_server() as srv:
        ctx = FaultContext(target=srv.url, request=USER)
        with runner_factory(ctx) as runner:
            with pytest.raises(ConfigError, match="completions=1 picks the demo's"):
                runner.start("traffic_surge", duration=5, completions=1)
            assert run_processes(runner.run.run_id) == []
        assert srv.bodies == []


def test_a_templated_surge_too_long_to_render_is_refused_with_the_way_out(
    runner_factory: Any,
) -> None:
    """Fresh inputs of a user's template are rendered by the runner and travel in the
    helper's args file, so the bound is lower than the demo's."""
    ctx = FaultContext(target="http://127.0.0.1:9", base_rate=10, request=USER)
    with runner_factory(ctx) as runner:
        with pytest.raises(ConfigError, match=r"at most 200,000 with PUT /api/embed.*distinct"):
            runner.start("traffic_surge", duration=900, factor=100)
        assert run_processes(runner.run.run_id) == []


# -- the command line -------------------------------------------------------------------
class _Captured(Exception):
    pass


def _context_of(args: list[str], monkeypatch: pytest.MonkeyPatch) -> FaultContext:
    """The context ``chaos run`` hands its runner (no fault is started): the wire is
    the runner tests' part, the options' meaning this one's."""
    seen: list[FaultContext] = []

    def runner(ctx: FaultContext, **kw: Any) -> None:
        seen.append(ctx)
        raise _Captured

    monkeypatch.setattr("aivitals.chaos._cli.ChaosRunner", runner)
    result = CliRunner().invoke(chaos, ["run", "traffic_surge", *args])
    assert isinstance(result.exception, _Captured), result.output
    return seen[0]


def test_chaos_run_takes_a_request_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    req = tmp_path / "req.yaml"
    req.write_text('path: /gen\nbody: {"model": "x", "text": "{{prompt}}"}\n')
    ctx = _context_of(["--target", "http://127.0.0.1:9", "--request", str(req)], monkeypatch)
    assert ctx.request == RequestTemplate.load(req)
    assert ctx.request.path == "/gen"


def test_chaos_run_takes_an_openai_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["--target", "http://127.0.0.1:9", "--openai", "chat", "--model", "tiny"]
    assert _context_of(args, monkeypatch).request == RequestTemplate.openai("chat", "tiny")


def test_chaos_run_sends_the_demo_s_request_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _context_of(["--target", "http://127.0.0.1:9"], monkeypatch).request is DEMO_EMBEDDINGS


@pytest.mark.slow
def test_chaos_run_with_an_openai_preset_reaches_the_service(chaos_root: Path) -> None:
    """End to end once: the option, the fault, its helper, the service's log (slow: the
    run lasts long enough for a helper started on a busy machine to send)."""
    with tiny_server() as srv:
        args = ["run", "overlong_inputs", "--duration", "3s", "--target", srv.url]
        args += ["--openai", "chat", "--model", "tiny", "-p", "chars=2000", "-p", "rate=200"]
        result = CliRunner().invoke(chaos, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        assert "stopped overlong_inputs: reverted" in result.output
    assert srv.paths and set(srv.paths) == {"/v1/chat/completions"}
    assert srv.bodies[0].startswith(b'{"model": "tiny", "messages": [{"role": "user"')


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--openai", "chat"], "--openai chat needs --model"),
        (["--model", "m"], "give --openai too"),
        (["--openai", "chat", "--model", "m", "--request", "r.yaml"], "not both"),
        (["--request", "missing.yaml"], r"missing\.yaml.*cannot read it"),
    ],
)
def test_chaos_run_refuses_a_bad_request_choice_before_any_fault(
    extra: list[str], match: str, chaos_root: Path
) -> None:
    result = CliRunner().invoke(
        chaos, ["run", "traffic_surge", "--target", "http://127.0.0.1:9", *extra]
    )
    assert isinstance(result.exception, ConfigError)
    assert result.exit_code == 1
    assert re.search(match, str(result.exception))
    assert not chaos_root.exists() or not any(chaos_root.iterdir())


def _helper_args(
    name: str, ctx: FaultContext, monkeypatch: pytest.MonkeyPatch, **params: Any
) -> dict[str, Any]:
    """What the fault hands its load-generator helper, without starting one."""
    from aivitals.chaos import _clients
    from aivitals.chaos._registry import get_fault

    seen: list[dict[str, Any]] = []

    def client_load(fault: Any, ctx: FaultContext, specs: list[RequestSpec], **kw: Any) -> int:
        seen.append({"specs": specs, **kw})
        return 0

    monkeypatch.setattr(_clients, "client_load", client_load)
    get_fault(name)(duration=5, **params)._start(ctx)
    return seen[0]


@pytest.mark.parametrize(
    "completions,fresh",
    [
        (0, {"path": "/v1/embeddings", "prompt_tokens": 24, "max_tokens": 16}),
        (1, {"path": "/v1/completions", "prompt_tokens": 32, "max_tokens": 16}),
    ],
)
def test_the_demo_s_surge_asks_its_helper_for_what_it_did_before(
    completions: int, fresh: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = FaultContext(target="http://127.0.0.1:9", base_rate=10)
    args = _helper_args("traffic_surge", ctx, monkeypatch, factor=5, completions=completions)
    assert args == {"specs": [], "rate": 50.0, "fresh": fresh}


def test_the_demo_s_overlong_input_is_the_embeddings_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx = FaultContext(target="http://127.0.0.1:9")
    args = _helper_args("overlong_inputs", ctx, monkeypatch, chars=1000)
    text = ("lorem ipsum dolor sit amet " * 38)[:1000]
    assert args["specs"] == [embeddings_request(text)]
    assert args["specs"][0].body == b'{"input": "' + text.encode() + b'"}'
