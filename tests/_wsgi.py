"""Drive a WSGI app in-process as a server would: a hand-built environ, call, iterate, close."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from typing import Any

Environ = dict[str, Any]


def environ(
    method: str = "GET",
    path: str = "/",
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Environ:
    env: Environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "t",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "HTTP_HOST": "t",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": io.StringIO(),
        "wsgi.multithread": False,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    if body:
        env["CONTENT_LENGTH"] = str(len(body))
        env["CONTENT_TYPE"] = "application/octet-stream"
    for name, value in (headers or {}).items():
        env["HTTP_" + name.upper().replace("-", "_")] = value
    env.update(extra)
    return env


class Answer:
    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = b""

    def start_response(
        self, status: str, headers: list[tuple[str, str]], exc_info: Any = None
    ) -> Callable[[bytes], None]:
        self.status = int(status[:3])
        self.headers = {k.lower(): v for k, v in headers}
        return lambda data: None


def call(app: Callable[..., Iterable[bytes]], env: Environ) -> Answer:
    """One request the way a server makes it: call, iterate, close."""
    answer = Answer()
    result = app(env, answer.start_response)
    try:
        answer.body = b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return answer
