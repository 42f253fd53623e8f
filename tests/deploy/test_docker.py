"""deploy/docker: what the Dockerfiles copy exists, and what they run is what the repo has.

The images themselves are built with podman where a base image can be had
(docs/deploy.md says what was built on the development machine); CI does not
build them (the service image carries torch).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"


def _instructions(path: Path) -> list[tuple[str, str]]:
    text = path.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("name", ["agent.Dockerfile", "service.Dockerfile"])
def test_every_copied_path_exists(name: str) -> None:
    steps = _instructions(DOCKER / name)
    assert steps[0][0] == "ARG" and steps[1][0] == "FROM"
    copies = [rest for word, rest in steps if word == "COPY" and not rest.startswith("--from")]
    assert copies
    for rest in copies:
        *sources, _dest = rest.split()
        for source in sources:
            assert (ROOT / source).exists(), f"{name} copies {source}, which does not exist"


def test_the_agent_image_runs_the_cli_the_daemonset_calls() -> None:
    steps = dict(_instructions(DOCKER / "agent.Dockerfile"))
    assert steps["ENTRYPOINT"] == '["aivitals"]'
    assert '"agent", "--exporter"' in steps["CMD"]
    assert "[gpu]" in steps["RUN"]


def test_the_service_image_serves_the_example_app() -> None:
    steps = _instructions(DOCKER / "service.Dockerfile")
    cmd = next(rest for word, rest in steps if word == "CMD")
    found = re.search(r'"(\w+):(\w+)"', cmd)
    assert found is not None, cmd
    module, attr = found.groups()
    assert module == "service"  # examples/service.py is copied to /app/service.py
    assert "/app/service.py" in " ".join(rest for word, rest in steps if word == "COPY")
    tree = ast.parse((ROOT / "examples" / "service.py").read_text())
    assigned = {
        t.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    assert attr in assigned, f"examples/service.py defines no {attr!r} for uvicorn"
    assert '"--host", "0.0.0.0"' in cmd and '"--port", "8000"' in cmd
