"""The agent's --web-config: Prometheus' web-config format, TLS and basic auth on every path.

Scraped with a real HTTPS client (httpx) against certificates the openssl CLI made;
the basic-auth hash of the unit tests is the one Prometheus' own basic-auth guide
publishes for the password ``test``, so the check is against bcrypt as others compute it.
"""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path

import httpx
import pytest

from aivitals.agent import Agent, AgentConfig
from aivitals.agent._webconfig import load_web_config
from aivitals.cli import main
from aivitals.errors import ConfigError, WebConfigError
from tests._pki import Pki, bcrypt_hash, make_pki
from tests._servers import promtool

from .conftest import Counting, wait_for

#: bcrypt of "test" from prometheus.io's "Securing Prometheus API and UI endpoints using
#: basic auth" guide (cost 12: about 0.2 s a check here).
GUIDE_HASH = "$2b$12$hNf2lSsxfm0.i4a.1kVpSOVyBCfIB51VRjgBUyv6kdnyTlgWj81Ay"


def _write(tmp_path: Path, text: str, name: str = "web.yml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _agent(web: Path) -> Agent:
    config = AgentConfig(
        listen="127.0.0.1:0",
        interval=0.2,
        gpu="none",
        exporter=True,
        web_config=load_web_config(web),
    )
    return Agent(config, collectors=[Counting()])


def test_basic_auth_refuses_a_scrape_without_the_password(tmp_path: Path) -> None:
    web = _write(tmp_path, f"basic_auth_users:\n  prometheus: '{GUIDE_HASH}'\n")
    with _agent(web) as agent, httpx.Client(base_url=agent.url, timeout=5) as c:
        wait_for(lambda: agent.ready)
        bare = c.get("/metrics")
        assert bare.status_code == 401
        assert bare.headers["WWW-Authenticate"] == 'Basic realm="aivitals"'
        assert "host_load1" not in bare.text
        assert c.get("/metrics", auth=("prometheus", "nope")).status_code == 401
        assert c.get("/metrics", auth=("someone", "test")).status_code == 401
        ok = c.get("/metrics", auth=("prometheus", "test"))
        assert ok.status_code == 200 and "host_load1" in ok.text
        # remembered: a second scrape with the same credentials is served too
        assert c.get("/metrics", auth=("prometheus", "test")).status_code == 200
        # the kubelet's probes carry no credentials and say only whether it runs
        assert c.get("/-/healthy").status_code == 200
        assert c.get("/-/ready").status_code == 200
        garbled = c.get("/metrics", headers={"Authorization": "Basic !!notbase64"})
        assert garbled.status_code == 401
        # C strings end at a NUL: "test" followed by anything is not "test"
        assert c.get("/metrics", auth=("prometheus", "test\0more")).status_code == 401


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("basic_auth_users: [a, b]\n", "expected a mapping of user name"),
        ("basic_auth_users:\n  u: plaintext\n", "basic_auth_users.u: not a bcrypt hash"),
        ("tls_server_config:\n  cert_file: c.pem\n", "needs both cert_file and key_file"),
        (
            "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n  cipher_suites: [x]\n",
            "cipher_suites not supported",
        ),
        ("http_server_config:\n  http2: false\n", "http_server_config not supported"),
        ("tls_server_config: [1]\n", "expected a mapping"),
        ("- a\n- b\n", "expected a mapping at the top"),
        ("basic_auth_users: {u: 'x'\n", "not valid YAML"),
        (
            "tls_server_config:\n  cert_file: missing.pem\n  key_file: missing.key\n",
            "cert_file: cannot read",
        ),
    ],
)
def test_a_bad_web_config_is_refused_at_load(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(WebConfigError, match=r"web-config .*web\.yml") as info:
        load_web_config(_write(tmp_path, text))
    assert says in str(info.value)
    assert isinstance(info.value, ConfigError)  # the CLI's "bad setting" exit 1


def test_a_certificate_that_is_not_pem_or_not_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "c.pem").write_text("not a certificate\n")
    (tmp_path / "k.pem").write_text("not a key\n")
    web = _write(tmp_path, "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n")
    with pytest.raises(WebConfigError, match=r"certificate .*c\.pem and key .*k\.pem"):
        load_web_config(web)
    (tmp_path / "dir.pem").mkdir()  # unreadable as a file, even for root
    web = _write(tmp_path, "tls_server_config:\n  cert_file: c.pem\n  key_file: dir.pem\n")
    with pytest.raises(WebConfigError, match=r"key_file: cannot read .*dir\.pem"):
        load_web_config(web)


def test_the_cli_stops_at_start_on_a_missing_web_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.yml"
    with pytest.raises(SystemExit) as info:
        main(["agent", "--exporter", "--gpu", "none", "--web-config", str(missing)])
    assert info.value.code == 1
    err = capsys.readouterr().err
    assert f"WebConfigError: web-config {missing}: cannot read it" in err


def _tls_config(pki: Pki, tmp_path: Path, extra: str = "") -> Path:
    # relative names: resolved from the config file's directory, as Prometheus does
    for src in (pki.server_cert, pki.server_key, pki.ca):
        shutil.copy(src, tmp_path / src.name)
    hashed = bcrypt_hash("s3cret")
    return _write(
        tmp_path,
        "tls_server_config:\n"
        f"  cert_file: {pki.server_cert.name}\n"
        f"  key_file: {pki.server_key.name}\n"
        f"{extra}"
        f"basic_auth_users:\n  prometheus: '{hashed}'\n",
    )


def _https(agent: Agent) -> str:
    return agent.url.replace("http://", "https://")


def test_tls_and_basic_auth_with_a_real_https_client(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    web = _tls_config(pki, tmp_path)
    trust = ssl.create_default_context(cafile=str(pki.ca))
    with _agent(web) as agent:
        wait_for(lambda: agent.ready)
        with httpx.Client(base_url=_https(agent), verify=trust, timeout=5) as c:
            assert c.get("/metrics").status_code == 401
            ok = c.get("/metrics", auth=("prometheus", "s3cret"))
            assert ok.status_code == 200 and "host_load1" in ok.text
            assert c.get("/-/ready").status_code == 200
        # plain HTTP on the TLS port gets no metrics, and the agent serves on after it
        with pytest.raises(httpx.HTTPError):
            httpx.get(agent.url + "/metrics", timeout=3)
        # a client that does not trust the agent's CA refuses the handshake
        rogue = ssl.create_default_context(cafile=str(pki.rogue_ca))
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(_https(agent) + "/-/healthy", verify=rogue, timeout=3)
        again = httpx.get(
            _https(agent) + "/metrics", verify=trust, auth=("prometheus", "s3cret"), timeout=5
        )
        assert again.status_code == 200


def test_client_certificates_when_the_config_requires_them(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    extra = f"  client_ca_file: {pki.ca.name}\n  client_auth_type: RequireAndVerifyClientCert\n"
    web = _tls_config(pki, tmp_path, extra)
    with _agent(web) as agent:
        wait_for(lambda: agent.ready)
        url = _https(agent) + "/metrics"
        mine = ssl.create_default_context(cafile=str(pki.ca))
        mine.load_cert_chain(pki.client_cert, pki.client_key)
        ok = httpx.get(url, verify=mine, auth=("prometheus", "s3cret"), timeout=5)
        assert ok.status_code == 200
        for cert, key in ((None, None), (pki.rogue_client_cert, pki.rogue_client_key)):
            ctx = ssl.create_default_context(cafile=str(pki.ca))
            if cert is not None and key is not None:
                ctx.load_cert_chain(cert, key)
            with pytest.raises(httpx.HTTPError):
                httpx.get(url, verify=ctx, auth=("prometheus", "s3cret"), timeout=3)


def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path) -> None:
    """cert-manager rewrites the Secret's files in place: the next connection gets them."""
    old, new = make_pki(tmp_path / "old"), make_pki(tmp_path / "new")
    web = _tls_config(old, tmp_path)
    with _agent(web) as agent:
        wait_for(lambda: agent.ready)
        url = _https(agent) + "/-/healthy"
        old_trust = ssl.create_default_context(cafile=str(old.ca))
        new_trust = ssl.create_default_context(cafile=str(new.ca))
        assert httpx.get(url, verify=old_trust, timeout=5).status_code == 200
        # a half-written renewal (a key that does not match) keeps the old certificate
        shutil.copy(new.server_key, tmp_path / old.server_key.name)
        assert httpx.get(url, verify=old_trust, timeout=5).status_code == 200
        shutil.copy(new.server_cert, tmp_path / old.server_cert.name)
        assert httpx.get(url, verify=new_trust, timeout=5).status_code == 200
        with pytest.raises(httpx.ConnectError):
            httpx.get(url, verify=old_trust, timeout=3)


def test_promtool_accepts_the_web_config_the_agent_accepts(tmp_path: Path) -> None:
    """One format for Prometheus and the agent: what the agent loads, promtool checks too."""
    pki = make_pki(tmp_path / "pki")
    web = _tls_config(pki, tmp_path)
    load_web_config(web)
    proc = promtool("check", "web-config", str(web))
    assert proc.returncode == 0, proc.stdout + proc.stderr
