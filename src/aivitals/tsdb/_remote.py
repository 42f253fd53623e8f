"""``RemoteConnection``: how to reach a Prometheus-API server as it is deployed.

A bare URL reaches a Prometheus on localhost. A deployed one sits behind
``--web.config.file`` (basic auth, TLS, client certificates) or a proxy that
wants a bearer token, or is a Thanos, Mimir or managed Prometheus that wants a
tenant header. This object holds those settings; this module turns them into
an ``httpx.Client`` and words what goes wrong (a secret file that cannot be
read, a TLS handshake that fails, a 401) naming the file and the peer. No
secret is held here: only the paths of the files that hold them.
"""

from __future__ import annotations

import base64
import re
import ssl
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar

import httpx

from ..errors import AivitalsError, BackendAuthError, ConfigError

__all__ = ["POST_ABOVE", "RemoteConnection", "refused_message", "tls_failure", "tls_message"]

#: A query whose form (``query=...&start=...``) encodes longer than this many bytes is
#: POSTed under method "auto": proxies in front of a Prometheus refuse long URLs (414).
POST_ABOVE = 2048

_T = TypeVar("_T")
#: "[SSL: X] x (_ssl.c:2580)" -> "x"
_OPENSSL_NOISE = re.compile(r"^\[[^\]]*\]\s*|\s*\(_ssl\.c:\d+\)$")
_FIELD_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 token
_PATHS = ("bearer_token_file", "basic_auth_password_file", "ca_file", "cert_file", "key_file")
_NOT_A_HEADER = {
    "authorization": "credentials come from --bearer-token-file or --basic-auth",
    "content-type": "set by each request",
    "content-length": "set by each request",
    "host": "taken from the URL",
}


@dataclass(frozen=True, kw_only=True)
class RemoteConnection:
    """Credentials, TLS, extra headers and HTTP method for a remote backend.

    Secrets are never values here: the bearer token and the basic-auth password
    are read from their files, once when the client is made (a missing or
    unreadable file is a ``ConfigError`` naming it, before any query) and again
    at every request, so a rotated token (a Kubernetes projected service-account
    token, a Vault agent's file) serves the next query without a restart and
    without a refused query first.

    ::

        conn = RemoteConnection(
            bearer_token_file=Path("/var/run/secrets/token"),
            ca_file=Path("/etc/ssl/private-ca.pem"),
            headers={"X-Scope-OrgID": "team-a"},
        )
        prom = PrometheusBackend("https://mimir.example/prometheus", connection=conn)

    ``method``: ``"auto"`` sends GET, and POST when the query form is over
    ``POST_ABOVE`` bytes encoded; ``"POST"`` always POSTs; ``"GET"`` never does.
    """

    bearer_token_file: Path | None = None
    basic_auth_user: str | None = None
    basic_auth_password_file: Path | None = None
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    insecure_skip_verify: bool = False
    headers: Mapping[str, str] = field(default_factory=dict)
    method: Literal["auto", "GET", "POST"] = "auto"

    def __post_init__(self) -> None:
        for name in _PATHS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                raise ConfigError(f"{name} must be a pathlib.Path, got {value!r}")
        if self.bearer_token_file is not None and self.basic_auth_user is not None:
            raise ConfigError("--bearer-token-file and --basic-auth: choose one")
        if (self.basic_auth_user is None) != (self.basic_auth_password_file is None):
            raise ConfigError("basic auth needs both a user and a password file")
        user = self.basic_auth_user
        if user is not None and (not user or ":" in user or _has_control(user)):
            raise ConfigError(f"basic auth user {user!r}: must be non-empty, without ':'")
        if self.key_file is not None and self.cert_file is None:
            raise ConfigError("--key-file needs --cert-file (the client certificate)")
        if self.insecure_skip_verify and self.ca_file is not None:
            raise ConfigError("--ca-file and --insecure-skip-verify: choose one")
        if self.method not in ("auto", "GET", "POST"):
            raise ConfigError(f"method must be auto, GET or POST, got {self.method!r}")
        object.__setattr__(self, "headers", dict(self.headers))
        for name, value in self.headers.items():
            _check_header(name, value)

    def client(
        self, timeout: float, *, transport: httpx.BaseTransport | None = None
    ) -> httpx.Client:
        """An ``httpx.Client`` with these settings. Every file is read here first: one
        that is missing, unreadable or not what it should be is a ``ConfigError``
        naming it. ``transport`` replaces the network (tests, a proxy's transport)."""
        auth = _FileAuth(self) if self.has_credentials else None
        return httpx.Client(
            timeout=timeout,
            verify=self._ssl_context(),
            auth=auth,
            headers=dict(self.headers),
            transport=transport,
        )

    @property
    def has_credentials(self) -> bool:
        """True when a bearer token or basic auth is sent."""
        return self.bearer_token_file is not None or self.basic_auth_user is not None

    def _ssl_context(self) -> ssl.SSLContext | bool:
        if self.insecure_skip_verify:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_file is not None:
            ca = self.ca_file
            ctx = _load(
                f"--ca-file {ca}",
                "a PEM CA certificate",
                lambda: ssl.create_default_context(cafile=str(ca)),
            )
        elif self.cert_file is not None:
            ctx = httpx.create_ssl_context()  # the CA bundle httpx trusts without flags
        else:
            return True
        if self.cert_file is not None:
            cert, key = str(self.cert_file), None if self.key_file is None else str(self.key_file)
            files = f"--cert-file {cert}" + (f" / --key-file {key}" if key else "")
            expect = "a PEM certificate and its key" + ("" if key else " (or give --key-file)")
            # without a password callback OpenSSL would prompt on the terminal for an
            # encrypted key; a key here must be unencrypted, as Prometheus' own key_file
            _load(files, expect, lambda: ctx.load_cert_chain(cert, key, password=_no_passphrase))
        return ctx


def refused_message(conn: RemoteConnection, url: str, status: int, body: str) -> str:
    """The message for a 401 or 403 answer: what was refused and what to check."""
    first = body.strip().splitlines()[0][:200] if body.strip() else ""
    what = {401: "401 Unauthorized", 403: "403 Forbidden"}.get(status, f"HTTP {status}")
    said = f" ({first!r})" if first and first.lower() not in what.lower() else ""
    return f"{url} answered {what}{said}: {_refused_hint(conn, status, first)}"


def _refused_hint(conn: RemoteConnection, status: int, said: str) -> str:
    low = said.lower()
    if ("org id" in low or "tenant" in low) and not conn.headers:
        return "it wants a tenant: --header 'X-Scope-OrgID: TENANT'"
    if status == 403:
        return "the credentials were taken but may not read this: check what they grant"
    if conn.bearer_token_file is not None:
        return f"check the token in --bearer-token-file {conn.bearer_token_file}"
    if conn.basic_auth_user is not None:
        return (
            f"check the user {conn.basic_auth_user!r} and the password in "
            f"{conn.basic_auth_password_file} (--basic-auth)"
        )
    return "it wants credentials: --bearer-token-file FILE or --basic-auth USER:PASSWORD_FILE"


def tls_message(conn: RemoteConnection, peer: str, err: ssl.SSLError) -> str:
    """The message for a failed TLS handshake with ``peer``: why, the files it was judged
    against, and what to check."""
    reason = getattr(err, "verify_message", None) or _OPENSSL_NOISE.sub("", str(err))
    upper = str(err).upper()
    # an alert is the server ending the handshake: about our (missing) certificate
    refused = ("CERTIFICATE_REQUIRED", "BAD_CERTIFICATE", "UNKNOWN_CA", "HANDSHAKE_FAILURE")
    if "ALERT" in upper and any(k in upper for k in refused):
        hint = (
            "the server wants a client certificate: --cert-file and --key-file"
            if conn.cert_file is None
            else f"the server refused the client certificate {conn.cert_file}: "
            "is it signed by a CA the server trusts (its client_ca_file)?"
        )
    elif "WRONG_VERSION_NUMBER" in upper or "RECORD_LAYER_FAILURE" in upper:
        hint = "does the server speak TLS? try http://"
    else:
        hint = ""
    text = f"TLS handshake with {peer} failed: {reason} ({_trust(conn)})"
    return text + (f": {hint}" if hint else "")


def _trust(conn: RemoteConnection) -> str:
    if conn.insecure_skip_verify:
        parts = ["server certificate not verified: --insecure-skip-verify"]
    elif conn.ca_file is not None:
        parts = [f"CA file {conn.ca_file}"]
    else:
        parts = ["the default CA bundle; a private CA needs --ca-file"]
    if conn.cert_file is not None:
        parts.append(f"client certificate {conn.cert_file}")
    return "; ".join(parts)


class _FileAuth(httpx.Auth):
    """``Authorization`` from a token or password file, read at every request."""

    def __init__(self, conn: RemoteConnection) -> None:
        self._conn = conn
        self._header(ConfigError)  # a file that cannot be read fails before any query

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = self._header(BackendAuthError)
        yield request

    def _header(self, error: type[AivitalsError]) -> str:
        conn = self._conn
        if conn.bearer_token_file is not None:
            return "Bearer " + read_secret(conn.bearer_token_file, "--bearer-token-file", error)
        assert conn.basic_auth_user is not None and conn.basic_auth_password_file is not None
        password = read_secret(conn.basic_auth_password_file, "--basic-auth password file", error)
        pair = f"{conn.basic_auth_user}:{password}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")


def read_secret(path: Path, what: str, error: type[AivitalsError] = ConfigError) -> str:
    """The secret in ``path``, without surrounding whitespace (as Prometheus reads its
    ``credentials_file`` and ``password_file``); ``error`` names the file otherwise."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} {path}: no such file") from None
    except PermissionError:
        raise error(f"{what} {path}: cannot be read (permission denied)") from None
    except UnicodeDecodeError:
        raise error(f"{what} {path}: not UTF-8 text") from None
    except OSError as exc:
        raise error(f"{what} {path}: cannot be read ({exc.strerror or exc})") from None
    secret = text.strip()
    if not secret:
        raise error(f"{what} {path}: empty")
    if _has_control(secret):
        raise error(f"{what} {path}: holds more than one line or a control character")
    if what == "--bearer-token-file" and not secret.isascii():
        raise error(f"{what} {path}: a token must be ASCII")
    return secret


def tls_failure(exc: BaseException) -> ssl.SSLError | None:
    """The ``ssl.SSLError`` under an httpx transport error, if TLS is what failed."""
    seen: BaseException | None = exc
    for _ in range(16):
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _no_passphrase() -> str:
    raise ConfigError("the private key is encrypted: give an unencrypted key (PEM)")


def _has_control(text: str) -> bool:
    return any(ord(c) < 32 or ord(c) == 127 for c in text)


def _check_header(name: str, value: str) -> None:
    if not isinstance(name, str) or not _FIELD_NAME.match(name):
        raise ConfigError(f"--header {name!r}: not a valid header name")
    if not isinstance(value, str) or _has_control(value.replace("\t", " ")):
        raise ConfigError(f"--header {name}: the value may not hold a line break")
    why = _NOT_A_HEADER.get(name.lower())
    if why is not None:
        raise ConfigError(f"--header {name}: {why}")


def _load(what: str, expect: str, load: Callable[[], _T]) -> _T:
    """A certificate or key loaded; what goes wrong a ``ConfigError`` naming the file."""
    try:
        return load()
    except ConfigError as exc:
        raise ConfigError(f"{what}: {exc}") from None
    except FileNotFoundError:
        raise ConfigError(f"{what}: no such file") from None
    except PermissionError:
        raise ConfigError(f"{what}: cannot be read (permission denied)") from None
    except (ssl.SSLError, OSError, ValueError) as exc:
        detail = _OPENSSL_NOISE.sub("", str(exc))
        raise ConfigError(f"{what}: not {expect}: {detail}") from None
