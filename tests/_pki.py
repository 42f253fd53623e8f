"""Secrets for the tests of remote backends behind ``--web.config.file``.

``make_pki`` makes a CA, a server certificate for 127.0.0.1 and a client
certificate with the ``openssl`` CLI (plus a second, untrusted CA with its own
client certificate); ``bcrypt_hash`` makes the hash a Prometheus web config
wants for basic auth, from the ``bcrypt`` package, Python's ``crypt`` (glibc's
libxcrypt does bcrypt) or ``htpasswd``, whichever this machine has.
"""

from __future__ import annotations

import base64
import importlib
import os
import shutil
import subprocess
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests._servers import require_binary

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    #: a CA nobody trusts, and a client certificate it signed
    rogue_ca: Path
    rogue_client_cert: Path
    rogue_client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    binary = require_binary("openssl")
    done = subprocess.run(
        [binary, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


def _ca(name: str, d: Path) -> tuple[Path, Path]:
    cert, key = d / f"{name}.pem", d / f"{name}.key"
    _openssl(
        "req", "-x509", *_EC, "-keyout", str(key), "-out", str(cert), "-days", "2",
        "-subj", f"/CN=aivitals test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )  # fmt: skip
    return cert, key


def _leaf(name: str, ca: tuple[Path, Path], usage: str, d: Path, serial: int) -> tuple[Path, Path]:
    cert, key, csr, ext = (d / f"{name}{s}" for s in (".pem", ".key", ".csr", ".ext"))
    san = "subjectAltName=IP:127.0.0.1,DNS:localhost\n" if usage == "serverAuth" else ""
    ext.write_text(
        f"{san}extendedKeyUsage={usage}\nbasicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nauthorityKeyIdentifier=keyid\n"
        "subjectKeyIdentifier=hash\n"
    )
    _openssl("req", *_EC, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}", cwd=d)
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
        "-set_serial", str(serial), "-days", "2", "-extfile", str(ext), "-out", str(cert),
        cwd=d,
    )  # fmt: skip
    return cert, key


def make_pki(d: Path) -> Pki:
    d.mkdir(parents=True, exist_ok=True)
    ca = _ca("ca", d)
    rogue = _ca("rogue-ca", d)
    server = _leaf("server", ca, "serverAuth", d, 2)
    client = _leaf("client", ca, "clientAuth", d, 3)
    rogue_client = _leaf("rogue-client", rogue, "clientAuth", d, 4)
    return Pki(ca[0], *server, *client, rogue[0], *rogue_client)


def bcrypt_hash(password: str) -> str:
    """A bcrypt hash of ``password`` (cost 5: the tests need no strength)."""
    try:
        bcrypt = importlib.import_module("bcrypt")
        hashed: bytes = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=5))
        return hashed.decode()
    except ImportError:
        pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            crypt = importlib.import_module("crypt")  # Python < 3.13
        except ImportError:
            crypt = None
    if crypt is not None:
        salt = base64.b64encode(os.urandom(16), altchars=b"./").decode()[:22]
        hashed_text = crypt.crypt(password, "$2b$05$" + salt)
        if hashed_text and hashed_text.startswith("$2b$"):
            return str(hashed_text)
    htpasswd = shutil.which("htpasswd")
    if htpasswd is not None:
        done = subprocess.run(
            [htpasswd, "-nbB", "-C", "5", "u", password], capture_output=True, text=True, check=True
        )
        return done.stdout.strip().split(":", 1)[1]
    msg = "no bcrypt: pip install bcrypt, or apt-get install apache2-utils (htpasswd)"
    if os.environ.get("CI"):
        pytest.fail(msg)
    pytest.skip(msg)
