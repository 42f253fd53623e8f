from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests._servers import free_port, require_binary

TOKEN = "serve-test-token"


@pytest.mark.integration
@pytest.mark.slow
def test_python_m_serve_with_redis_and_sim_gpu(tmp_path: Path) -> None:
    from aivitals.demo import RedisServer

    require_binary("redis-server")
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "AIVITALS_CHAOS_TOKEN": TOKEN}
    with RedisServer() as redis:
        argv = [
            sys.executable, "-m", "aivitals.demo.serve",
            "--port", str(port),
            "--redis-port", str(redis.port),
            "--sim-gpu-dir", str(tmp_path / "sim"),
        ]  # fmt: skip
        log = (tmp_path / "serve.log").open("wb")
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_ready(url, proc, tmp_path / "serve.log")
            with httpx.Client(base_url=url, timeout=30) as c:
                first = c.post("/v1/embeddings", json={"input": "served"})
                second = c.post("/v1/embeddings", json={"input": "served"})
                comp = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 5})
                chaos = c.get("/_aivitals/chaos", headers={"X-Aivitals-Token": TOKEN})
                ready = c.get("/readyz").json()
                metrics = c.get("/metrics").text
            assert first.status_code == 200 and second.headers["x-cache"] == "hit"
            assert comp.json()["usage"]["completion_tokens"] == 5
            assert chaos.status_code == 200
            assert "redis" in str(ready)
            # each kind of answer is its own cache, Redis behind both
            assert (
                'cache_requests_total{backend="redis",cache="embeddings",result="hit"} 1.0'
                in metrics
            )
            assert (
                'cache_requests_total{backend="redis",cache="completions",result="miss"} 1.0'
                in metrics
            )
            import redis as redis_lib

            keys = redis_lib.Redis.from_url(redis.url).keys("aivitals-demo:*")
            # the embedding and the completion live in Redis
            assert len(keys) == 2
        finally:
            proc.terminate()
            proc.wait(timeout=20)
            log.close()
        # uvicorn shuts down cleanly, then re-raises SIGTERM so the exit says why
        text = (tmp_path / "serve.log").read_text()
        assert proc.returncode in (0, -15), text[-2000:]
        assert "Traceback" not in text, text[-2000:]


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"serve exited {proc.returncode}: {log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    pytest.fail("serve did not answer within 120 s")
