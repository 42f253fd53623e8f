"""What one request to the user's service looks like: a template with a prompt slot.

Every fault that sends requests (a surge, over-long and malformed inputs) takes the
method, path, headers and body from one ``RequestTemplate``, so the drill speaks the
service's own API instead of the demo's. The body is JSON with a ``{{prompt}}``
placeholder in a string value (alone or inside a longer string); ``render`` puts a
prompt there, JSON-escaped.

**Usage**::

    from aivitals.load import RequestTemplate
    t = RequestTemplate.load("request.yaml")          # a user's own service
    t = RequestTemplate.openai("chat", "llama-3-8b")  # an OpenAI-compatible server
    spec = DEMO_EMBEDDINGS.render("hello world")      # POST /v1/embeddings {"input": ...}

A request file (YAML or JSON)::

    method: POST
    path: /embed
    headers: {Authorization: Bearer s3cret}
    body: {"inputs": "{{prompt}}", "truncate": false}
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError
from ._payload import RequestSpec

__all__ = [
    "DEMO_COMPLETIONS",
    "DEMO_EMBEDDINGS",
    "OPENAI_KINDS",
    "PLACEHOLDER",
    "RequestTemplate",
    "template_from_options",
]

PLACEHOLDER = "{{prompt}}"

#: Methods that carry a body: the prompt travels in it.
METHODS = ("POST", "PUT", "PATCH")

OPENAI_KINDS = ("completions", "chat")

#: Where a raw slot goes while a body is being built around bytes JSON cannot hold
#: (invalid UTF-8, raw control characters): plain ASCII, so the encoder leaves it as is.
_SLOT = "aivitals-raw-slot-5f1c9e"

_JSON = (("Content-Type", "application/json"),)


def _fill(node: Any, text: str) -> Any:
    if isinstance(node, str):
        return node.replace(PLACEHOLDER, text)
    if isinstance(node, list):
        return [_fill(v, text) for v in node]
    if isinstance(node, dict):
        return {k: _fill(v, text) for k, v in node.items()}
    return node


def _slots(node: Any) -> int:
    if isinstance(node, str):
        return node.count(PLACEHOLDER)
    if isinstance(node, list):
        return sum(_slots(v) for v in node)
    if isinstance(node, dict):
        return sum(_slots(v) for v in node.values())
    return 0


@dataclass(frozen=True)
class RequestTemplate:
    """A request with a ``{{prompt}}`` slot in its JSON body.

    ``body`` is the parsed JSON (a mapping); its string values hold the
    placeholder. ``source`` names where it came from (a file, a preset), for
    messages. Checked on construction: a body method, a path from ``/``, at
    least one placeholder.
    """

    method: str
    path: str
    body: Mapping[str, Any]
    headers: tuple[tuple[str, str], ...] = _JSON
    source: str = field(default="template", compare=False)

    def __post_init__(self) -> None:
        where = self.source
        if self.method not in METHODS:
            raise ConfigError(
                f"{where}: method {self.method!r} is not one of {', '.join(METHODS)} "
                "(the prompt travels in a JSON body)"
            )
        if not isinstance(self.path, str) or not self.path.startswith("/"):
            raise ConfigError(f"{where}: path {self.path!r} must start with '/'")
        if any(c in self.path for c in " \r\n"):
            raise ConfigError(f"{where}: path {self.path!r} holds whitespace")
        if not isinstance(self.body, Mapping):
            raise ConfigError(f"{where}: body must be a JSON object, got {self.body!r}")
        if _slots(self.body) == 0:
            raise ConfigError(
                f"{where}: the body has no {PLACEHOLDER} placeholder in any string value, "
                "so every request would carry the same input"
            )
        for k, v in self.headers:
            if any(c in k + v for c in "\r\n") or not k or ":" in k:
                raise ConfigError(f"{where}: header {k!r}: {v!r} is not a valid header")

    # -- building ------------------------------------------------------------------
    @classmethod
    def openai(cls, kind: str, model: str | None, *, max_tokens: int = 16) -> RequestTemplate:
        """An OpenAI-compatible server's ``/v1/completions`` or ``/v1/chat/completions``,
        not streamed, ``max_tokens`` short so the drill's load is its inputs'."""
        if kind not in OPENAI_KINDS:
            raise ConfigError(f"--openai {kind!r} is not one of {', '.join(OPENAI_KINDS)}")
        if not model:
            raise ConfigError(f"--openai {kind} needs --model NAME (the server's model name)")
        if kind == "completions":
            body: dict[str, Any] = {"model": model, "prompt": PLACEHOLDER}
            path = "/v1/completions"
        else:
            body = {"model": model, "messages": [{"role": "user", "content": PLACEHOLDER}]}
            path = "/v1/chat/completions"
        body["max_tokens"] = max_tokens
        return cls("POST", path, body, source=f"--openai {kind}")

    @classmethod
    def load(cls, path: str | Path) -> RequestTemplate:
        """A template from a YAML or JSON file: ``method`` (default POST), ``path``,
        ``headers`` (a mapping; ``Content-Type: application/json`` unless given) and
        ``body`` (a mapping, or a string holding JSON)."""
        where = f"request file {str(path)!r}"
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: cannot read it: {exc}") from exc
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where}: not valid YAML or JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a mapping with method, path, headers, body")
        unknown = sorted(set(raw) - {"method", "path", "headers", "body"})
        if unknown:
            raise ConfigError(f"{where}: unknown keys {unknown} (method, path, headers, body)")
        for key in ("path", "body"):
            if key not in raw:
                raise ConfigError(f"{where}: '{key}' is missing")
        body = raw["body"]
        if isinstance(body, str):
            try:
                body = json.loads(body)
            except ValueError as exc:
                raise ConfigError(f"{where}: body is not valid JSON: {exc}") from exc
        headers = raw.get("headers") or {}
        if not isinstance(headers, dict):
            raise ConfigError(f"{where}: headers must be a mapping of name: value")
        pairs = tuple((str(k), str(v)) for k, v in headers.items())
        if not any(k.lower() == "content-type" for k, _ in pairs):
            pairs = _JSON + pairs
        method = str(raw.get("method", "POST")).upper()
        return cls(method, str(raw["path"]), body, pairs, source=where)

    # -- rendering -----------------------------------------------------------------
    @property
    def stream(self) -> bool:
        """Whether the service answers as a stream (SSE): the body asks for it."""
        return self.body.get("stream") is True

    def render(self, prompt: str) -> RequestSpec:
        """The request with ``prompt`` in every slot, JSON-escaped (quotes, newlines,
        control characters and non-ASCII as the standard encoder writes them)."""
        body = json.dumps(_fill(self.body, prompt)).encode()
        return RequestSpec(
            self.method,
            self.path,
            body,
            self.headers,
            stream=self.stream,
            prompt_tokens=len(prompt.split()),
            expects_json=not self.stream,
        )

    def render_raw(self, raw: bytes, *, truncate: bool = False) -> RequestSpec:
        """The request with ``raw`` bytes as they are where the prompt goes, escaped
        by nobody: how a broken client sends invalid UTF-8 or raw control characters.
        ``truncate`` ends the body right after them, mid-string (invalid JSON)."""
        body = json.dumps(_fill(self.body, _SLOT)).encode()
        if truncate:
            body = body[: body.index(_SLOT.encode())] + raw
        else:
            body = body.replace(_SLOT.encode(), raw)
        # nothing to parse: the service answers such a body with an error
        return replace(self.render(""), body=body, prompt_tokens=0, expects_json=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "headers": [list(h) for h in self.headers],
            "body": dict(self.body),
            "source": self.source,
        }

    def describe(self) -> str:
        return f"{self.method} {self.path} ({self.source})"


#: The demo service's embeddings request: what validate's demo traffic and every
#: client fault send by default (``{"input": prompt}``).
DEMO_EMBEDDINGS = RequestTemplate(
    "POST", "/v1/embeddings", {"input": PLACEHOLDER}, source="the demo's embeddings"
)

#: The demo service's streaming completions (``traffic_surge`` ``completions=1``).
DEMO_COMPLETIONS = RequestTemplate(
    "POST",
    "/v1/completions",
    {"prompt": PLACEHOLDER, "max_tokens": 16, "stream": True},
    source="the demo's completions",
)


def template_from_options(
    request: str | Path | None, openai: str | None, model: str | None
) -> RequestTemplate:
    """The template that a command's ``--request FILE`` / ``--openai KIND --model NAME``
    name, the demo's embeddings when neither is given."""
    if request is not None and openai is not None:
        raise ConfigError("give --request FILE or --openai KIND, not both")
    if model is not None and openai is None:
        raise ConfigError("--model names the model of an --openai preset; give --openai too")
    if request is not None:
        return RequestTemplate.load(request)
    if openai is not None:
        return RequestTemplate.openai(openai, model)
    return DEMO_EMBEDDINGS
