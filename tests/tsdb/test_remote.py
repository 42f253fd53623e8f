"""RemoteConnection and the connection flags: credentials, headers, POST, refusals.

In-process (``httpx.MockTransport``, a recording HTTP server on 127.0.0.1); the
real Prometheus behind ``--web.config.file`` is in ``test_remote_e2e.py``.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from click.testing import CliRunner

from aivitals.cli import cli, main
from aivitals.diagnose import diagnose
from aivitals.errors import BackendAuthError, BackendError, ConfigError
from aivitals.tsdb import PrometheusBackend, RemoteConnection
from aivitals.tsdb._options import connection_from_flags, parse_headers
from aivitals.tsdb._remote import POST_ABOVE

T = 1_700_000_000
VECTOR = {"status": "success", "data": {"resultType": "vector", "result": []}}


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("first-token\n")
    return path


def _backend(
    conn: RemoteConnection,
    answer: Callable[[httpx.Request], httpx.Response] | None = None,
) -> tuple[PrometheusBackend, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        request.read()
        seen.append(request)
        return answer(request) if answer else httpx.Response(200, json=VECTOR)

    prom = PrometheusBackend(
        "http://prom.test", connection=conn, transport=httpx.MockTransport(handle)
    )
    return prom, seen


# --- the settings object -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"bearer_token_file": Path("t"), "basic_auth_user": "u",
          "basic_auth_password_file": Path("p")}, "choose one"),
        ({"basic_auth_user": "u"}, "both a user and a password file"),
        ({"basic_auth_user": "a:b", "basic_auth_password_file": Path("p")}, "without ':'"),
        ({"key_file": Path("k")}, "--key-file needs --cert-file"),
        ({"ca_file": Path("c"), "insecure_skip_verify": True}, "choose one"),
        ({"headers": {"Bad Name": "x"}}, "not a valid header name"),
        ({"headers": {"X-A": "a\r\nX-B: b"}}, "line break"),
        ({"headers": {"authorization": "Bearer x"}}, "credentials come from"),
        ({"headers": {"Content-Type": "text/plain"}}, "set by each request"),
        ({"method": "PUT"}, "auto, GET or POST"),
        ({"ca_file": "ca.pem"}, "must be a pathlib.Path"),
    ],
)  # fmt: skip
def test_contradictions_are_config_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RemoteConnection(**kwargs)


def test_flags_make_one_connection(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("x")
    conn = connection_from_flags(
        basic_auth=f"ops:{pw}",
        headers=("X-Scope-OrgID: team-a", "X-Extra:  two words "),
        post=True,
    )
    assert conn.basic_auth_user == "ops"
    assert conn.basic_auth_password_file == pw
    assert conn.headers == {"X-Scope-OrgID": "team-a", "X-Extra": "two words"}
    assert conn.method == "POST"
    assert connection_from_flags() == RemoteConnection()


@pytest.mark.parametrize(
    ("items", "match"),
    [(("X-Scope-OrgID",), "expected 'NAME: VALUE'"), (("A: 1", "a: 2"), "given twice")],
)
def test_bad_header_flags(items: tuple[str, ...], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_headers(items)


def test_basic_auth_flag_never_echoes_a_password_given_by_mistake(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["query", "--prometheus", "http://127.0.0.1:1", "--basic-auth", "ops:hunter2", "up"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("ConfigError: --basic-auth ops:")
    assert "never the password" in err
    assert "hunter2" not in err


# --- secret files ------------------------------------------------------------------------------
def test_missing_token_file_fails_at_start_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-token"
    with pytest.raises(ConfigError, match=f"--bearer-token-file {missing}: no such file"):
        PrometheusBackend(
            "http://prom.test", connection=RemoteConnection(bearer_token_file=missing)
        )


@pytest.mark.parametrize(("content", "match"), [(None, "cannot be read"), ("  \n", "empty")])
def test_unreadable_or_empty_token_file(tmp_path: Path, content: str | None, match: str) -> None:
    path = tmp_path / "token"
    if content is None:
        path.mkdir()  # a directory: unreadable as a file, even for root
    else:
        path.write_text(content)
    with pytest.raises(ConfigError, match=f"--bearer-token-file {path}: {match}"):
        PrometheusBackend("http://prom.test", connection=RemoteConnection(bearer_token_file=path))


def test_cli_names_the_missing_token_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "token"
    with pytest.raises(SystemExit):
        main(["query", "--prometheus", "http://x", "--bearer-token-file", str(missing), "up"])
    assert f"ConfigError: --bearer-token-file {missing}: no such file" in capsys.readouterr().err


def test_token_is_read_at_every_request_so_rotation_needs_no_restart(token: Path) -> None:
    prom, seen = _backend(RemoteConnection(bearer_token_file=token))
    with prom:
        prom.query("up", T)
        token.write_text("second-token")  # rotated, as a projected service-account token is
        prom.query("up", T)
    assert [r.headers["Authorization"] for r in seen] == [
        "Bearer first-token",
        "Bearer second-token",
    ]


def test_token_file_gone_mid_run_is_named(token: Path) -> None:
    prom, _ = _backend(RemoteConnection(bearer_token_file=token))
    token.unlink()
    with prom, pytest.raises(BackendAuthError, match=f"--bearer-token-file {token}: no such file"):
        prom.query("up", T)


def test_basic_auth_and_headers_are_sent(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret: with colon\n")
    conn = RemoteConnection(
        basic_auth_user="ops", basic_auth_password_file=pw, headers={"X-Scope-OrgID": "team-a"}
    )
    prom, seen = _backend(conn)
    with prom:
        prom.query("up", T)
    sent = seen[0].headers
    assert sent["Authorization"] == "Basic " + base64.b64encode(b"ops:s3cret: with colon").decode()
    assert sent["X-Scope-OrgID"] == "team-a"


# --- POST for long queries --------------------------------------------------------------------
def test_query_goes_by_post_only_when_long() -> None:
    prom, seen = _backend(RemoteConnection())
    short = "up"
    # the form is query=...&time=1700000000.000: find the longest expression that stays GET
    at_limit = "a" * (POST_ABOVE - len("query=&time=1700000000.000"))
    with prom:
        prom.query(short, T)
        prom.query(at_limit, T)
        prom.query(at_limit + "b", T)
        prom.query_range("x" * 5000, T, T + 60, 15)
    assert [r.method for r in seen] == ["GET", "GET", "POST", "POST"]
    posted = parse_qs(seen[3].content.decode())
    assert posted["query"] == ["x" * 5000]
    assert posted["step"] == ["15.000"]
    assert seen[3].headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert len(str(seen[3].url)) < 100


@pytest.mark.parametrize(("method", "expected"), [("POST", "POST"), ("GET", "GET")])
def test_method_can_be_forced(method: str, expected: str) -> None:
    prom, seen = _backend(RemoteConnection(method=method))  # type: ignore[arg-type]
    with prom:
        prom.query("up", T)
        prom.query("y" * 5000, T)
    assert [r.method for r in seen] == [expected, expected]


# --- 401 and 403 --------------------------------------------------------------------------------
def test_401_is_named_and_not_retried(token: Path) -> None:
    prom, seen = _backend(
        RemoteConnection(bearer_token_file=token),
        lambda r: httpx.Response(401, text="Unauthorized\n"),
    )
    with prom, pytest.raises(BackendAuthError) as info:
        prom.query("up", T)
    assert str(info.value) == (
        f"http://prom.test answered 401 Unauthorized: check the token in "
        f"--bearer-token-file {token}"
    )
    assert len(seen) == 1


def test_403_and_a_missing_tenant_are_named() -> None:
    prom, _ = _backend(RemoteConnection(), lambda r: httpx.Response(403, text="forbidden"))
    with prom, pytest.raises(BackendAuthError, match="403 Forbidden: the credentials were taken"):
        prom.query("up", T)
    # Mimir answers a query without X-Scope-OrgID with 401 "no org id"
    prom, _ = _backend(RemoteConnection(), lambda r: httpx.Response(401, text="no org id\n"))
    with prom, pytest.raises(BackendAuthError, match=r"'no org id'.*X-Scope-OrgID: TENANT"):
        prom.query("up", T)


def test_refused_diagnosis_stops_instead_of_listing_everything_unseen() -> None:
    prom, seen = _backend(RemoteConnection(), lambda r: httpx.Response(401, text="Unauthorized"))
    with prom, pytest.raises(BackendAuthError, match="401 Unauthorized"):
        diagnose(prom, end=T, window=600)
    assert 1 <= len(seen) <= 8  # at most the queries already in flight (8 workers), no more


def test_refusal_is_a_backend_error_for_callers_that_catch_those() -> None:
    assert issubclass(BackendAuthError, BackendError)


# --- every command that takes a URL takes the flags ---------------------------------------------
COMMANDS = [
    ["query"],
    ["diagnose"],
    ["snapshot"],
    ["report", "daily"],
    ["alerts"],
    ["console"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_remote_command_has_the_flags(command: list[str]) -> None:
    out = CliRunner().invoke(cli, [*command, "--help"]).output
    for flag in (
        "--bearer-token-file",
        "--basic-auth",
        "--ca-file",
        "--cert-file",
        "--key-file",
        "--insecure-skip-verify",
        "--header",
        "--post",
    ):
        assert flag in out, (command, flag)


@contextmanager
def _recording_server() -> Iterator[tuple[str, list[tuple[str, str, dict[str, str]]]]]:
    """A Prometheus API on 127.0.0.1 that answers empty and keeps each request's headers."""
    seen: list[tuple[str, str, dict[str, str]]] = []
    answers: dict[str, object] = {
        "/api/v1/query": VECTOR["data"],
        "/api/v1/query_range": {"resultType": "matrix", "result": []},
        "/api/v1/label/__name__/values": [],
        "/api/v1/alerts": {"alerts": []},
    }

    class Handler(BaseHTTPRequestHandler):
        # keep-alive, as Prometheus answers: a diagnosis asks many queries, and a new
        # connection for each (HTTP/1.0) tripled this test's time
        protocol_version = "HTTP/1.1"

        def _answer(self) -> None:
            path = urlsplit(self.path).path
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            seen.append((self.command, path, dict(self.headers)))
            body = json.dumps({"status": "success", "data": answers.get(path, {})}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize(
    "command",
    [
        ["query", "vector(1)", "--prometheus"],
        ["diagnose", "--window", "5m", "--prometheus"],
        ["snapshot", "--window", "1m", "--out", "{tmp}/s.aivsnap", "--prometheus"],
        ["report", "daily", "--prometheus"],
        ["alerts", "--prometheus"],
    ],
    ids=lambda c: " ".join(c[:2]),
)
def test_every_request_of_a_command_carries_the_token_and_the_headers(
    command: list[str], token: Path, tmp_path: Path
) -> None:
    with _recording_server() as (url, seen):
        args = [a.replace("{tmp}", str(tmp_path)) for a in command]
        flags = ["--bearer-token-file", str(token), "--header", "X-Scope-OrgID: team-a"]
        result = CliRunner().invoke(cli, [*args, url, *flags])
    assert result.exit_code == 0, (result.output, result.exception)
    assert seen
    for method, path, headers in seen:
        assert headers.get("Authorization") == "Bearer first-token", (method, path)
        assert headers.get("X-Scope-OrgID") == "team-a", (method, path)


def test_connection_flags_with_a_snapshot_are_refused(token: Path, tmp_path: Path) -> None:
    snap = tmp_path / "s.aivsnap"
    snap.write_text("")
    for command in (["diagnose"], ["query", "up"], ["report", "daily"]):
        result = CliRunner().invoke(
            cli, [*command, "--snapshot", str(snap), "--bearer-token-file", str(token)]
        )
        assert isinstance(result.exception, ConfigError), command
        assert "--snapshot reads a file" in str(result.exception)
