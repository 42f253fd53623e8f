"""Against a real uvicorn server: client disconnects and slow-loris clients."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests._servers import free_port

from ._server_app import STEP

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src") + os.pathsep + str(REPO)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "tests.protect._server_app:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
        else:
            raise AssertionError("uvicorn did not start")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def raw_post(port: int, body: bytes, *, declared: int | None = None) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    length = len(body) if declared is None else declared
    head = (
        f"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    return sock


def _rest_of_response(sock: socket.socket, got: bytes) -> bytes:
    """``got`` read on to the end of the body its head declares: the head and the body
    can come in two segments (on a loaded machine one read can return only the head)."""
    while b"\r\n\r\n" not in got and (chunk := sock.recv(4096)):
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    declared = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    while declared and len(body) < int(declared.group(1)) and (chunk := sock.recv(4096)):
        body += chunk
    return head + b"\r\n\r\n" + body


def state(url: str) -> dict[str, object]:
    return dict(httpx.get(url + "/state", timeout=5).json())


def wait_for(url: str, predicate: object, limit: float = 5.0) -> dict[str, object]:
    began = time.monotonic()
    while time.monotonic() - began < limit:
        current = state(url)
        if predicate(current):  # type: ignore[operator]
            return current
        time.sleep(0.02)
    raise AssertionError(f"state never matched: {state(url)}")


def test_client_disconnect_aborts_the_generation(server: str) -> None:
    port = int(server.rsplit(":", 1)[1])
    sock = raw_post(port, b'{"tokens": 1000}')
    wait_for(server, lambda s: s["running"] and s["steps"] >= 3)
    closed_at = time.time()
    sock.close()
    final = wait_for(server, lambda s: not s["running"])
    assert final["aborted_with"] == "client_disconnect"
    assert isinstance(final["stopped_at"], float)
    # noticed at once and stopped at the next token (generous for a busy machine)
    assert final["stopped_at"] - closed_at < 10 * STEP + 0.3
    assert int(final["steps"]) < 1000  # type: ignore[call-overload]


def test_slow_loris_is_cut_off_and_never_holds_the_slot(server: str) -> None:
    port = int(server.rsplit(":", 1)[1])
    sock = raw_post(port, b'{"tok', declared=100)  # 5 of 100 bytes, then silence
    began = time.monotonic()
    # the only admission slot is free for a well-behaved client meanwhile
    response = httpx.post(server + "/generate", json={"tokens": 2}, timeout=5)
    assert response.status_code == 200
    sock.settimeout(5)
    first = sock.recv(4096)
    waited = time.monotonic() - began
    answer = _rest_of_response(sock, first).decode("latin-1")
    sock.close()
    assert answer.startswith("HTTP/1.1 408"), answer
    assert '"code":"TIMEOUT"' in answer
    assert 0.4 <= waited < 3.0
