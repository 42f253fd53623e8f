"""What the reference services' tests share: reading an exposition, stopping a server's
process group, and the README's ``aivitals agent`` watching the service."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests._paths import REPO
from tests._servers import free_port


def total(text: str, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples with ``labels`` in an exposition."""
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def stop_group(proc: subprocess.Popen[bytes], wait: float = 20.0) -> None:
    """SIGTERM the session started for a server (its workers share it), then SIGKILL."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(wait)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(5)


@contextmanager
def agent(service_port: int, scrape_url: str, log: Path) -> Iterator[str]:
    """The README's ``aivitals agent --port ... --scrape ...``, scraping every second
    and without rules (they are not what is checked here, and cost CPU); its URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "aivitals.cli", "agent", "--listen", f"127.0.0.1:{port}"]
    cmd += ["--port", str(service_port), "--scrape", f"encode={scrape_url}"]
    cmd += ["--scrape-interval", "1s", "--gpu", "none", "--no-kernel-log", "--no-rules"]
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the agent exited:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the agent is not ready:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        stop_group(proc)


def query(agent_url: str, promql: str) -> list[dict[str, Any]]:
    """An instant query on the agent; its result list."""
    answer = httpx.get(f"{agent_url}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result
