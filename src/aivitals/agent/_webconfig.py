"""TLS and basic auth for the agent's HTTP server, from Prometheus' own web-config file.

The file is the one Prometheus and its exporters read with ``--web.config.file``
(``tls_server_config`` and ``basic_auth_users``), so a cluster owner writes one
format for all of them and can check it with ``promtool check web-config``.
Relative file names are taken from the config file's directory, as Prometheus'
exporter-toolkit does. A key this agent does not implement is refused at start
rather than ignored: a security setting that silently does nothing is worse than
an error.

Passwords are checked against their bcrypt hashes by the system's ``crypt(3)``
(libxcrypt, as on Debian, Ubuntu and Fedora), so no Python package is needed;
where libcrypt has no bcrypt (musl, macOS), ``basic_auth_users`` is refused at start.
"""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import hashlib
import hmac
import logging
import os
import re
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import WebConfigError

__all__ = ["WebConfig", "load_web_config"]

log = logging.getLogger("aivitals.agent.http")

_TLS_KEYS = {
    "cert_file",
    "key_file",
    "client_ca_file",
    "client_auth_type",
    "min_version",
    "max_version",
}
#: Prometheus' client_auth_type values Python's ssl can honour: it cannot ask for a
#: certificate without verifying it, so RequestClientCert and RequireAnyClientCert are refused.
_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
_BCRYPT = re.compile(r"^\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}$")
#: Paths a kubelet probe calls without credentials; they say only whether the agent runs.
AUTH_EXEMPT = frozenset({"/-/healthy", "/-/ready"})


class _Crypt:
    """bcrypt through the system's ``crypt(3)``; one call at a time (it is not reentrant)."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("crypt")
        if name is None:
            raise WebConfigError(
                "basic_auth_users: no system libcrypt to check bcrypt hashes with "
                "(install libxcrypt, or use TLS client certificates instead)"
            )
        lib = ctypes.CDLL(name)
        lib.crypt.restype = ctypes.c_char_p
        lib.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        self._fn = lib.crypt
        self._lock = threading.Lock()

    def __call__(self, password: bytes, hashed: bytes) -> bytes:
        with self._lock:
            out = self._fn(password, hashed)
        return bytes(out or b"")


_crypt: _Crypt | None = None
_crypt_lock = threading.Lock()


def _get_crypt() -> _Crypt:
    global _crypt
    with _crypt_lock:
        if _crypt is None:
            _crypt = _Crypt()
        return _crypt


def _file(base: Path, key: str, value: Any) -> Path:
    if not isinstance(value, str) or not value:
        raise WebConfigError(f"tls_server_config.{key}: expected a file name, got {value!r}")
    path = base / value
    try:
        with path.open("rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise WebConfigError(
            f"tls_server_config.{key}: cannot read {path}: {exc.strerror or exc}"
        ) from None
    return path


@dataclass(frozen=True)
class _TLS:
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None
    verify: ssl.VerifyMode
    min_version: ssl.TLSVersion
    max_version: ssl.TLSVersion | None

    def files(self) -> tuple[Path, ...]:
        return tuple(p for p in (self.cert_file, self.key_file, self.client_ca_file) if p)

    def context(self) -> ssl.SSLContext:
        """A server context from the files as they are now; WebConfigError names the file."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = self.min_version
        if self.max_version is not None:
            ctx.maximum_version = self.max_version
        try:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as exc:
            raise WebConfigError(
                f"tls_server_config: the certificate {self.cert_file} and key {self.key_file} "
                f"do not load as a PEM pair: {exc}"
            ) from None
        if self.client_ca_file is not None:
            try:
                ctx.load_verify_locations(cafile=str(self.client_ca_file))
            except (ssl.SSLError, OSError) as exc:
                raise WebConfigError(
                    f"tls_server_config.client_ca_file: {self.client_ca_file} does not load "
                    f"as PEM certificates: {exc}"
                ) from None
        ctx.verify_mode = self.verify
        return ctx


@dataclass
class WebConfig:
    """A loaded web-config: the TLS files and the users, checked; build it with
    :func:`load_web_config`.

    ``context()`` re-reads the certificate when its files change (cert-manager
    renews a Secret in place), keeping the last good context if the new files do
    not load. ``authorized()`` checks an ``Authorization`` header; a success is
    remembered (a digest of the credentials, never the password) so a scrape every
    15 s does not pay bcrypt's cost each time.
    """

    path: str
    tls: _TLS | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    _ctx: ssl.SSLContext | None = field(default=None, repr=False)
    _stamp: tuple[tuple[int, int], ...] = field(default=(), repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _good: set[bytes] = field(default_factory=set, repr=False)

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def _stamps(self) -> tuple[tuple[int, int], ...]:
        assert self.tls is not None
        out = []
        for p in self.tls.files():
            try:
                st = os.stat(p)
                out.append((st.st_mtime_ns, st.st_size))
            except OSError:
                out.append((-1, -1))
        return tuple(out)

    def context(self) -> ssl.SSLContext | None:
        """The TLS context to wrap a connection with (None: plain HTTP)."""
        if self.tls is None:
            return None
        with self._lock:
            stamp = self._stamps()
            if self._ctx is None or stamp != self._stamp:
                try:
                    self._ctx = self.tls.context()
                except WebConfigError as exc:
                    if self._ctx is None:
                        raise
                    log.error("%s; serving on with the previous certificate", exc)
                self._stamp = stamp
            return self._ctx

    @property
    def needs_auth(self) -> bool:
        return bool(self.users)

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization: Basic ...`` header names a user and its password."""
        if not self.users:
            return True
        if not header or header[:6].lower() != "basic ":
            return False
        try:
            user, sep, password = base64.b64decode(header[6:].strip(), validate=True).partition(
                b":"
            )
        except ValueError:
            return False
        if not sep or b"\0" in password:
            return False  # crypt(3) would read the password only up to a NUL byte
        name = user.decode("utf-8", "replace")
        hashed = self.users.get(name)
        digest = hashlib.sha256(user + b"\0" + password + b"\0" + (hashed or b"")).digest()
        with self._lock:
            if hashed is not None and digest in self._good:
                return True
        # An unknown user is checked against a hash too, so the time taken does not say
        # which user names exist.
        target = hashed or next(iter(self.users.values()))
        ok = hmac.compare_digest(_get_crypt()(password, target), target) and hashed is not None
        if ok:
            with self._lock:
                if len(self._good) > 1024:  # bounded: a new credential evicts all, rarely
                    self._good.clear()
                self._good.add(digest)
        return ok


def _version(key: str, value: Any) -> ssl.TLSVersion:
    if value not in _VERSIONS:
        raise WebConfigError(
            f"tls_server_config.{key}: {value!r} is not one of {', '.join(_VERSIONS)}"
        )
    return _VERSIONS[value]


def _tls(base: Path, raw: Any) -> _TLS | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise WebConfigError("tls_server_config: expected a mapping")
    unknown = set(raw) - _TLS_KEYS
    if unknown:
        raise WebConfigError(
            f"tls_server_config: {', '.join(sorted(unknown))} not supported by the aivitals "
            f"agent (it reads {', '.join(sorted(_TLS_KEYS))}); remove it"
        )
    if not raw.get("cert_file") or not raw.get("key_file"):
        raise WebConfigError("tls_server_config: needs both cert_file and key_file")
    auth = raw.get("client_auth_type", "NoClientCert")
    if auth not in _CLIENT_AUTH:
        raise WebConfigError(
            f"tls_server_config.client_auth_type: {auth!r} is not supported; use one of "
            f"{', '.join(_CLIENT_AUTH)}"
        )
    ca = raw.get("client_ca_file")
    if _CLIENT_AUTH[auth] != ssl.CERT_NONE and not ca:
        raise WebConfigError(
            f"tls_server_config.client_auth_type: {auth} needs client_ca_file to verify with"
        )
    tls = _TLS(
        cert_file=_file(base, "cert_file", raw["cert_file"]),
        key_file=_file(base, "key_file", raw["key_file"]),
        client_ca_file=None if not ca else _file(base, "client_ca_file", ca),
        verify=_CLIENT_AUTH[auth],
        min_version=_version("min_version", raw.get("min_version", "TLS12")),
        max_version=(
            None if raw.get("max_version") is None else _version("max_version", raw["max_version"])
        ),
    )
    tls.context()  # a certificate that does not load stops the agent here
    return tls


def _users(raw: Any) -> dict[str, bytes]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise WebConfigError("basic_auth_users: expected a mapping of user name to bcrypt hash")
    out = {}
    for user, hashed in raw.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise WebConfigError(f"basic_auth_users: {user!r} is not a user name (no ':')")
        if not isinstance(hashed, str) or _BCRYPT.match(hashed) is None:
            raise WebConfigError(
                f"basic_auth_users.{user}: not a bcrypt hash ($2b$<cost>$..., as "
                "htpasswd -nBC 10 or python3-bcrypt write it); the password itself is never "
                "stored here"
            )
        encoded = hashed.encode()
        # crypt(3) of anything with this hash as the setting must keep its salt: a
        # libcrypt without bcrypt answers "*0" or nothing, and would refuse every scrape.
        if not _get_crypt()(b"", encoded).startswith(encoded[:29]):
            raise WebConfigError(
                f"basic_auth_users.{user}: the system libcrypt cannot check bcrypt hashes"
            )
        out[user] = encoded
    return out


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    """Read and check a Prometheus web-config file; WebConfigError says what is wrong."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise WebConfigError(f"web-config {p}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise WebConfigError(f"web-config {p}: not UTF-8 text") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WebConfigError(f"web-config {p}: not valid YAML: {exc}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise WebConfigError(f"web-config {p}: expected a mapping at the top")
    unknown = set(raw) - {"tls_server_config", "basic_auth_users"}
    if unknown:
        raise WebConfigError(
            f"web-config {p}: {', '.join(sorted(map(str, unknown)))} not supported by the "
            "aivitals agent (it reads tls_server_config and basic_auth_users); remove it"
        )
    try:
        return WebConfig(
            path=str(p),
            tls=_tls(p.parent, raw.get("tls_server_config")),
            users=_users(raw.get("basic_auth_users")),
        )
    except WebConfigError as exc:
        raise WebConfigError(f"web-config {p}: {exc}") from None
