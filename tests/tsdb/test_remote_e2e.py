"""Remote backends as they are deployed: a real Prometheus behind ``--web.config.file``.

Three Prometheus servers: basic auth over plain HTTP; TLS (a CA and a server
certificate made here) with basic auth; TLS that requires a client certificate.
The right settings get an answer; each wrong one gets a ``BackendAuthError`` or
``ConfigError`` that names what to check. A query over 4 KiB goes by POST.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from aivitals.cli import cli
from aivitals.console import RemoteSource
from aivitals.errors import BackendAuthError, ConfigError
from aivitals.tsdb import PrometheusBackend, RemoteConnection
from tests._pki import Pki, bcrypt_hash, make_pki
from tests._servers import Server, prometheus, require_binary, victoria_metrics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

USER, PASSWORD = "ops", "correct horse battery staple"
#: over 4 KiB as a query, more encoded; Prometheus answers 1
LONG = "vector(1)" + " + 0 * vector(1)" * 300


class _Recording(httpx.HTTPTransport):
    """The network, with each request's method and URL length kept."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.seen: list[tuple[str, int]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append((request.method, len(str(request.url))))
        return super().handle_request(request)


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Pki, Path, Path]]:
    d = tmp_path_factory.mktemp("secrets")
    pki = make_pki(d / "pki")
    good, bad = d / "password", d / "wrong-password"
    good.write_text(PASSWORD + "\n")  # a trailing newline, as editors leave it
    bad.write_text("not it\n")
    yield pki, good, bad


def _basic(file: Path, **tls: object) -> RemoteConnection:
    return RemoteConnection(basic_auth_user=USER, basic_auth_password_file=file, **tls)


@pytest.fixture(scope="module")
def basic_prom(secrets: tuple[Pki, Path, Path]) -> Iterator[Server]:
    web = f"basic_auth_users:\n  {USER}: '{bcrypt_hash(PASSWORD)}'\n"
    ready = httpx.Client(auth=(USER, PASSWORD))
    with ready, prometheus(web_config_yaml=web, ready_client=ready) as server:
        yield server


@pytest.fixture(scope="module")
def tls_prom(secrets: tuple[Pki, Path, Path]) -> Iterator[Server]:
    pki = secrets[0]
    web = (
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        f"basic_auth_users:\n  {USER}: '{bcrypt_hash(PASSWORD)}'\n"
    )
    ready = _basic(secrets[1], ca_file=pki.ca).client(5.0)
    with ready, prometheus(web_config_yaml=web, ready_client=ready) as server:
        yield server


@pytest.fixture(scope="module")
def mtls_prom(secrets: tuple[Pki, Path, Path]) -> Iterator[Server]:
    pki = secrets[0]
    web = (
        f"tls_server_config:\n  cert_file: {pki.server_cert}\n  key_file: {pki.server_key}\n"
        f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki.ca}\n"
    )
    conn = RemoteConnection(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
    with conn.client(5.0) as ready, prometheus(web_config_yaml=web, ready_client=ready) as server:
        yield server


def _one(url: str, conn: RemoteConnection) -> float:
    with PrometheusBackend(url, connection=conn, timeout=5.0) as prom:
        return prom.query("vector(1)").vector[0].value


# --- basic auth ----------------------------------------------------------------------------
def test_basic_auth_right_password_answers(
    basic_prom: Server, secrets: tuple[Pki, Path, Path]
) -> None:
    assert _one(basic_prom.url, _basic(secrets[1])) == 1.0


def test_basic_auth_wrong_password_is_named_401(
    basic_prom: Server, secrets: tuple[Pki, Path, Path]
) -> None:
    with pytest.raises(BackendAuthError) as info:
        _one(basic_prom.url, _basic(secrets[2]))
    text = str(info.value)
    assert f"{basic_prom.url} answered 401 Unauthorized" in text
    assert f"check the user '{USER}' and the password in {secrets[2]}" in text


def test_no_credentials_is_named_401(basic_prom: Server) -> None:
    with pytest.raises(BackendAuthError, match="401 Unauthorized: it wants credentials"):
        _one(basic_prom.url, RemoteConnection())


def test_long_query_goes_by_post_and_is_answered(
    basic_prom: Server, secrets: tuple[Pki, Path, Path]
) -> None:
    assert len(LONG) > 4096
    wire = _Recording()
    with PrometheusBackend(basic_prom.url, connection=_basic(secrets[1]), transport=wire) as prom:
        assert prom.query(LONG).vector[0].value == 1.0
        assert prom.query_range(LONG, 1_700_000_000, 1_700_000_060, 15).matrix[0].points
        assert prom.query("vector(2)").vector[0].value == 2.0
    methods = [m for m, _ in wire.seen]
    assert methods == ["POST", "POST", "GET"]
    assert all(n < 200 for _, n in wire.seen[:2])  # the query is in the body, not the URL


def test_cli_query_with_basic_auth(basic_prom: Server, secrets: tuple[Pki, Path, Path]) -> None:
    args = ["query", "--prometheus", basic_prom.url, "--json", "vector(1)"]
    ok = CliRunner().invoke(cli, [*args, "--basic-auth", f"{USER}:{secrets[1]}"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["result"][0]["value"][1] == "1.0"
    bad = CliRunner().invoke(cli, [*args, "--basic-auth", f"{USER}:{secrets[2]}"])
    assert isinstance(bad.exception, BackendAuthError)
    assert "401 Unauthorized" in str(bad.exception)


def test_cli_alerts_with_basic_auth(basic_prom: Server, secrets: tuple[Pki, Path, Path]) -> None:
    args = ["alerts", "--prometheus", basic_prom.url]
    ok = CliRunner().invoke(cli, [*args, "--basic-auth", f"{USER}:{secrets[1]}"])
    assert ok.exit_code == 0, ok.output
    assert "active alerts: 0" in ok.output
    bad = CliRunner().invoke(cli, args)
    assert isinstance(bad.exception, BackendAuthError)


def test_validate_reads_a_prometheus_behind_basic_auth(
    basic_prom: Server, secrets: tuple[Pki, Path, Path]
) -> None:
    """validate --prometheus with the connection flags: the rules API is read with the
    credentials (this Prometheus has none of aivitals' rules, the next refusal); without
    them the refusal names the 401 and the flags, before any fault."""
    from aivitals.validate._remote import RemoteAlerts

    conn = _basic(secrets[1])
    with pytest.raises(ConfigError, match=r"none of aivitals' .* alerts is loaded"):
        RemoteAlerts(PrometheusBackend(basic_prom.url, connection=conn), connection=conn).check()
    with pytest.raises(ConfigError, match=r"401 Unauthorized.*--basic-auth"):
        RemoteAlerts(PrometheusBackend(basic_prom.url)).check()


def test_cli_diagnose_refused_stops_at_once(
    basic_prom: Server, secrets: tuple[Pki, Path, Path]
) -> None:
    """Wrong credentials end the diagnosis with the named error, not a report of
    everything unseen (and not one refused query per signature)."""
    args = ["diagnose", "--prometheus", basic_prom.url, "--window", "5m", "--format", "json"]
    bad = CliRunner().invoke(cli, [*args, "--basic-auth", f"{USER}:{secrets[2]}"])
    assert isinstance(bad.exception, BackendAuthError), bad.output
    assert "answered 401 Unauthorized" in str(bad.exception)
    ok = CliRunner().invoke(cli, [*args, "--basic-auth", f"{USER}:{secrets[1]}"])
    assert ok.exit_code == 0, ok.output
    assert "findings" in json.loads(ok.output)


# --- TLS with basic auth ------------------------------------------------------------------
def test_tls_with_ca_and_basic_auth_answers(
    tls_prom: Server, secrets: tuple[Pki, Path, Path]
) -> None:
    pki, good, _ = secrets
    assert tls_prom.url.startswith("https://")
    assert _one(tls_prom.url, _basic(good, ca_file=pki.ca)) == 1.0


def test_tls_unknown_ca_names_the_peer_and_the_ca(
    tls_prom: Server, secrets: tuple[Pki, Path, Path]
) -> None:
    pki, good, _ = secrets
    with pytest.raises(BackendAuthError) as info:
        _one(tls_prom.url, _basic(good, ca_file=pki.rogue_ca))
    text = str(info.value)
    assert f"TLS handshake with 127.0.0.1:{tls_prom.port} failed" in text
    assert "certificate verify failed" in text or "local issuer" in text
    assert f"CA file {pki.rogue_ca}" in text
    with pytest.raises(BackendAuthError, match="a private CA needs --ca-file"):
        _one(tls_prom.url, _basic(good))


def test_tls_insecure_skip_verify_answers(
    tls_prom: Server, secrets: tuple[Pki, Path, Path]
) -> None:
    assert _one(tls_prom.url, _basic(secrets[1], insecure_skip_verify=True)) == 1.0


def test_plain_http_to_a_tls_server_says_https(tls_prom: Server) -> None:
    from aivitals.errors import BackendError

    with pytest.raises(BackendError, match="use an https:// URL"):
        _one(tls_prom.url.replace("https://", "http://"), RemoteConnection())


def test_https_to_a_plain_server_says_so(basic_prom: Server) -> None:
    with pytest.raises(BackendAuthError, match="does the server speak TLS"):
        _one(basic_prom.url.replace("http://", "https://"), RemoteConnection())


def test_cli_diagnose_over_tls_and_basic_auth(
    tls_prom: Server, secrets: tuple[Pki, Path, Path]
) -> None:
    pki, good, _ = secrets
    base = ["diagnose", "--prometheus", tls_prom.url, "--window", "5m", "--format", "json"]
    flags = ["--ca-file", str(pki.ca), "--basic-auth", f"{USER}:{good}"]
    ok = CliRunner().invoke(cli, [*base, *flags])
    assert ok.exit_code == 0, ok.output
    refused = CliRunner().invoke(cli, [*base, "--ca-file", str(pki.ca)])
    assert isinstance(refused.exception, BackendAuthError)


# --- TLS requiring a client certificate -------------------------------------------------------
def test_client_certificate_answers(mtls_prom: Server, secrets: tuple[Pki, Path, Path]) -> None:
    pki = secrets[0]
    conn = RemoteConnection(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
    assert _one(mtls_prom.url, conn) == 1.0


def test_missing_client_certificate_is_named(
    mtls_prom: Server, secrets: tuple[Pki, Path, Path]
) -> None:
    pki = secrets[0]
    with pytest.raises(BackendAuthError) as info:
        _one(mtls_prom.url, RemoteConnection(ca_file=pki.ca))
    text = str(info.value)
    assert f"TLS handshake with 127.0.0.1:{mtls_prom.port} failed" in text
    assert "wants a client certificate: --cert-file and --key-file" in text


def test_untrusted_client_certificate_is_named(
    mtls_prom: Server, secrets: tuple[Pki, Path, Path]
) -> None:
    pki = secrets[0]
    conn = RemoteConnection(
        ca_file=pki.ca, cert_file=pki.rogue_client_cert, key_file=pki.rogue_client_key
    )
    with pytest.raises(BackendAuthError) as info:
        _one(mtls_prom.url, conn)
    assert str(pki.rogue_client_cert) in str(info.value)


def test_console_source_over_client_certificate(
    mtls_prom: Server, secrets: tuple[Pki, Path, Path]
) -> None:
    pki = secrets[0]
    conn = RemoteConnection(ca_file=pki.ca, cert_file=pki.client_cert, key_file=pki.client_key)
    source = RemoteSource(mtls_prom.url, kind="prometheus", tick=1.0, connection=conn)
    try:
        assert source.alerts()["alerts"] == []
        assert source.backend.query("vector(1)").vector[0].value == 1.0
    finally:
        source.close()
    with pytest.raises(BackendAuthError):
        RemoteSource(mtls_prom.url, kind="prometheus", connection=RemoteConnection()).alerts()


def test_key_that_does_not_match_the_certificate_is_a_config_error(
    secrets: tuple[Pki, Path, Path],
) -> None:
    pki = secrets[0]
    conn = RemoteConnection(cert_file=pki.client_cert, key_file=pki.rogue_client_key)
    with pytest.raises(ConfigError, match=str(pki.client_cert)):
        PrometheusBackend("https://127.0.0.1:1", connection=conn)


def test_encrypted_key_is_a_config_error_not_a_terminal_prompt(
    secrets: tuple[Pki, Path, Path], tmp_path: Path
) -> None:
    pki = secrets[0]
    locked = tmp_path / "locked.key"
    done = subprocess.run(
        [require_binary("openssl"), "ec", "-in", str(pki.client_key), "-out", str(locked),
         "-aes256", "-passout", "pass:x"],
        capture_output=True, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    conn = RemoteConnection(cert_file=pki.client_cert, key_file=locked)
    with pytest.raises(ConfigError, match=f"--key-file {locked}: the private key is encrypted"):
        PrometheusBackend("https://127.0.0.1:1", connection=conn)


# --- VictoriaMetrics takes the long query by POST too ----------------------------------------
def test_victoria_metrics_answers_a_long_query_by_post() -> None:
    wire = _Recording()
    with victoria_metrics() as vm, PrometheusBackend(vm.url, transport=wire) as backend:
        assert backend.query(LONG).vector[0].value == 1.0
    assert [m for m, _ in wire.seen] == ["POST"]
