"""The connection flags of every command that reads a remote backend.

``aivitals query``, ``diagnose``, ``snapshot``, ``report daily``, ``alerts``,
``console`` and ``validate`` (for its ``--prometheus`` and ``--alertmanager``) take the same
flags, declared once here, and get them as one ``RemoteConnection``::

    @click.command()
    @click.option("--prometheus", metavar="URL")
    @remote_options
    def cmd(prometheus: str | None, connection: RemoteConnection) -> None:
        backend = PrometheusBackend(prometheus, connection=connection)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..errors import ConfigError
from ._remote import POST_ABOVE, RemoteConnection

__all__ = ["connection_from_flags", "parse_headers", "remote_options"]

_R = TypeVar("_R")
_FILE = click.Path(dir_okay=False, path_type=Path)
_OPTIONS = (
    click.option(
        "--bearer-token-file",
        type=_FILE,
        help="Send 'Authorization: Bearer' with the token in FILE (read at every request).",
    ),
    click.option(
        "--basic-auth",
        metavar="USER:PASSWORD_FILE",
        help="Basic auth as USER, with the password read from PASSWORD_FILE.",
    ),
    click.option("--ca-file", type=_FILE, help="Verify the server against this CA (PEM)."),
    click.option("--cert-file", type=_FILE, help="Client certificate (PEM) for mutual TLS."),
    click.option("--key-file", type=_FILE, help="Its private key (PEM) [default: in --cert-file]."),
    click.option(
        "--insecure-skip-verify",
        is_flag=True,
        help="Do not verify the server's certificate (a test server; never in production).",
    ),
    click.option(
        "--header",
        "headers",
        multiple=True,
        metavar="'NAME: VALUE'",
        help="Send this header too, e.g. 'X-Scope-OrgID: tenant' (repeatable).",
    ),
    click.option(
        "--post",
        is_flag=True,
        help=f"POST every query (default: POST those over {POST_ABOVE} bytes encoded).",
    ),
)
_NAMES = (
    "bearer_token_file",
    "basic_auth",
    "ca_file",
    "cert_file",
    "key_file",
    "insecure_skip_verify",
    "headers",
    "post",
)


def remote_options(fn: Callable[..., _R]) -> Callable[..., _R]:
    """Add the connection flags to a click command, which receives them as one
    ``connection: RemoteConnection`` keyword argument (checked before it runs; refused
    beside a ``--snapshot``, a file)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> _R:
        flags = {name: kwargs.pop(name) for name in _NAMES}
        connection = connection_from_flags(**flags)
        if kwargs.get("snapshot") and connection != RemoteConnection():
            raise ConfigError("--snapshot reads a file: the connection flags are for a URL")
        return fn(*args, connection=connection, **kwargs)

    for option in reversed(_OPTIONS):
        run = option(run)
    return run


def connection_from_flags(
    *,
    bearer_token_file: Path | None = None,
    basic_auth: str | None = None,
    ca_file: Path | None = None,
    cert_file: Path | None = None,
    key_file: Path | None = None,
    insecure_skip_verify: bool = False,
    headers: tuple[str, ...] = (),
    post: bool = False,
) -> RemoteConnection:
    """The ``RemoteConnection`` the flags describe; a ``ConfigError`` naming the flag."""
    user, password_file = _basic_auth(basic_auth)
    return RemoteConnection(
        bearer_token_file=bearer_token_file,
        basic_auth_user=user,
        basic_auth_password_file=password_file,
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
        insecure_skip_verify=insecure_skip_verify,
        headers=parse_headers(headers),
        method="POST" if post else "auto",
    )


def parse_headers(items: tuple[str, ...]) -> dict[str, str]:
    """``('X-Scope-OrgID: team-a',)`` -> ``{'X-Scope-OrgID': 'team-a'}``; a name given
    twice (in any case) is refused rather than one silently winning."""
    out: dict[str, str] = {}
    seen: set[str] = set()
    for item in items:
        name, sep, value = item.partition(":")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(f"--header {item!r}: expected 'NAME: VALUE'")
        if name.lower() in seen:
            raise ConfigError(f"--header {name}: given twice")
        seen.add(name.lower())
        out[name] = value.strip()
    return out


def _basic_auth(text: str | None) -> tuple[str | None, Path | None]:
    if text is None:
        return None, None
    user, sep, path = text.partition(":")
    if not sep or not user or not path:
        raise ConfigError("--basic-auth: expected USER:PASSWORD_FILE (a file, never the password)")
    # The part after ':' may be a password typed by mistake: never echo it back.
    if not Path(path).is_file():
        raise ConfigError(
            f"--basic-auth {user}:…: the password file does not exist or is not a file "
            "(it takes USER:PASSWORD_FILE, never the password itself)"
        )
    return user, Path(path)
