"""Requests as bytes: built once before the run so sending costs one write.

The JSON bodies follow the OpenAI-like API of the demo service:
``/v1/embeddings`` takes ``{"input": ...}`` and ``/v1/completions`` takes
``{"prompt": ..., "max_tokens": N, "stream": true}``.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace

__all__ = [
    "RequestSpec",
    "completions_request",
    "embeddings_request",
    "get_request",
    "make_prompt",
]

# Common short English words: with most tokenizers each is one token, so a
# prompt of N words is close to N tokens without loading a tokenizer here.
_VOCAB = (
    "the of and to in is it you that he was for on are with as his they be at one have "
    "this from or had by hot word but what some we can out other were all there when up "
    "use your how said an each she which do their time if will way about many then them "
    "write would like so these her long make thing see him two has look more day could go "
    "come did number sound no most people my over know water than call first who may down "
    "side been now find any new work part take get place made live where after back little"
)
_WORDS = tuple(_VOCAB.split())


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One HTTP request to send: method, path, body and whether the answer streams (SSE).

    ``prompt_tokens`` is the client's own count of what it sent, used when the
    service reports no ``usage``.
    """

    method: str
    path: str
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    stream: bool = False
    prompt_tokens: int = 0
    expects_json: bool = field(default=False)

    def wire(self, host: str) -> bytes:
        """The request as HTTP/1.1 bytes with keep-alive."""
        lines = [f"{self.method} {self.path} HTTP/1.1", f"Host: {host}"]
        lines += [f"{k}: {v}" for k, v in self.headers]
        if self.body or self.method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(self.body)}")
        if self.stream:
            lines.append("Accept: text/event-stream")
        head = "\r\n".join(lines) + "\r\n\r\n"
        return head.encode("latin-1") + self.body


def make_prompt(n_tokens: int, *, rng: random.Random | None = None) -> str:
    """A prompt of about ``n_tokens`` tokens made of common words (content is meaningless)."""
    rng = rng or random.Random(0)
    return " ".join(rng.choices(_WORDS, k=max(n_tokens, 1)))


def _json_body(obj: dict[str, object]) -> tuple[bytes, tuple[tuple[str, str], ...]]:
    return json.dumps(obj).encode(), (("Content-Type", "application/json"),)


def embeddings_request(text: str, *, path: str = "/v1/embeddings") -> RequestSpec:
    """``POST /v1/embeddings`` with ``{"input": text}``: the demo's template, rendered."""
    # Imported here: the template module builds on RequestSpec, defined above.
    from ._template import DEMO_EMBEDDINGS

    spec = DEMO_EMBEDDINGS.render(text)
    return spec if path == spec.path else replace(spec, path=path)


def completions_request(
    prompt: str, max_tokens: int, *, stream: bool = True, path: str = "/v1/completions"
) -> RequestSpec:
    """``POST /v1/completions`` with ``{"prompt", "max_tokens", "stream"}``."""
    body, headers = _json_body({"prompt": prompt, "max_tokens": max_tokens, "stream": stream})
    return RequestSpec(
        "POST",
        path,
        body,
        headers,
        stream=stream,
        prompt_tokens=len(prompt.split()),
        expects_json=not stream,
    )


def get_request(path: str = "/") -> RequestSpec:
    """A plain ``GET``."""
    return RequestSpec("GET", path)
