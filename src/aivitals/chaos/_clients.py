"""Faults made of client traffic: over-long inputs, malformed inputs, a surge.

Each runs the load generator in a helper process, so a crash of the runner
cannot leave it sending, and the runner's own timing is not disturbed.
"""

from __future__ import annotations

import base64
import json
import random
from typing import Any

from ..errors import ConfigError
from ..load import RequestSpec, completions_request, embeddings_request, make_prompt
from ._fault import Fault, FaultContext, FaultEffect, Touch

__all__ = ["MalformedInputs", "OverlongInputs", "TrafficSurge", "client_load"]


def _spec_json(spec: RequestSpec) -> dict[str, Any]:
    return {
        "method": spec.method,
        "path": spec.path,
        "body": base64.b64encode(spec.body).decode(),
        "headers": list(spec.headers),
        "stream": spec.stream,
    }


def client_load(
    fault: Fault,
    ctx: FaultContext,
    specs: list[RequestSpec],
    *,
    rate: float | None = None,
    concurrency: int | None = None,
    fresh: dict[str, Any] | None = None,
) -> int:
    """Start a helper that sends ``specs`` (cycled) at ``rate`` or ``concurrency``.

    ``fresh`` instead of ``specs``: every request a new input, made by the load
    generator itself (``{"path", "prompt_tokens", "max_tokens"}``), so the args file
    stays small however long the fault runs.
    """
    return fault.helper(
        "load",
        f"{fault.name}-client",
        url=ctx.require("target").rstrip("/") + "/",
        specs=[_spec_json(s) for s in specs],
        fresh=fresh,
        rate=rate,
        concurrency=concurrency,
        allow_hosts=list(ctx.allow_hosts),
        timeout=30,
    )


#: The most requests a surge of fresh inputs builds (the load generator makes them all
#: before sending): an hour at 500/s.
_MAX_FRESH_SENDS = 1_800_000

#: Every client-traffic fault: one load-generator helper of the run.
_CLIENT = Touch(
    "",
    "starts a load-generator helper process sending requests to the service",
    "the run: stopped at revert (and at its own deadline); cleanup stops it after a crash",
    processes=True,
)


class OverlongInputs(Fault):
    """One client sending ``chars``-character inputs to ``/v1/embeddings``."""

    name = "overlong_inputs"
    params = {"chars": (100_000, 1_000, 10_000_000), "rate": (5, 0.1, 1000)}
    touches = (_CLIENT,)

    def _start(self, ctx: FaultContext) -> FaultEffect:
        text = "lorem ipsum dolor sit amet " * (int(self.values["chars"]) // 27 + 1)
        spec = embeddings_request(text[: int(self.values["chars"])])
        pid = client_load(self, ctx, [spec], rate=self.values["rate"])
        return FaultEffect(client_url=ctx.target, details={"pid": pid})


def _raw(body: bytes, path: str = "/v1/embeddings") -> RequestSpec:
    return RequestSpec("POST", path, body, (("Content-Type", "application/json"),))


#: What one misbehaving client sends: control characters (as JSON escapes and
#: raw), invalid UTF-8, full-width digits, a truncated body.
MALFORMED_BODIES: tuple[bytes, ...] = (
    json.dumps({"input": "hello \x00\x01\x02 world \x1b[31m"}).encode(),
    b'{"input": "caf\xc3 \xff\xfe invalid utf-8 \xed\xa0\x80"}',
    json.dumps({"input": "\uff11\uff12\uff13 full-width digits"}, ensure_ascii=False).encode(),
    b'{"input": "\x07\x08 raw control chars \x0b\x0c"}',
    b'{"input": "truncated',
)


class MalformedInputs(Fault):
    """One client sending control characters, invalid UTF-8 and broken JSON."""

    name = "malformed_inputs"
    params = {"rate": (10, 0.1, 1000)}
    touches = (_CLIENT,)

    def _start(self, ctx: FaultContext) -> FaultEffect:
        pid = client_load(self, ctx, [_raw(b) for b in MALFORMED_BODIES], rate=self.values["rate"])
        return FaultEffect(client_url=ctx.target, details={"pid": pid})


class TrafficSurge(Fault):
    """Extra open-loop load at ``factor`` times the context's ``base_rate`` on
    ``/v1/embeddings`` (``completions`` 1 for streaming completions instead).

    A surge is new traffic: by default (``distinct`` 0) every request carries a
    prompt of its own, so a response cache in front of the model does not absorb
    it as it would a replay. ``distinct`` N cycles N prompts instead: a cache then
    learns them, and the surge fades once it has (at x10, 4096 cycled prompts are all
    cache hits within five minutes).
    """

    name = "traffic_surge"
    params = {"factor": (5, 1.1, 1000), "completions": (0, 0, 1), "distinct": (0, 0, 100_000)}
    choices = {"completions": (0, 1)}
    touches = (
        Touch("completions=0", _CLIENT.touches + " (embeddings)", _CLIENT.afterwards, True),
        Touch(
            "completions=1", _CLIENT.touches + " (streaming completions)", _CLIENT.afterwards, True
        ),
    )

    def _start(self, ctx: FaultContext) -> FaultEffect:
        rng = random.Random()
        n = int(self.values["distinct"])
        completions = bool(self.values["completions"])
        rate = self.values["factor"] * ctx.base_rate
        if n == 0:
            # The load generator makes one request per send time before it starts
            # (about 1 KB each): refuse a surge that would hold gigabytes of them.
            sends = rate * (self.duration + 10.0)
            if sends > _MAX_FRESH_SENDS:
                raise ConfigError(
                    f"fault 'traffic_surge': {rate:g}/s for {self.duration:g} s is "
                    f"{sends:,.0f} distinct requests (at most {_MAX_FRESH_SENDS:,}); "
                    "shorten the fault or set distinct to cycle that many prompts"
                )
            path = "/v1/completions" if completions else "/v1/embeddings"
            fresh = {"path": path, "prompt_tokens": 32 if completions else 24, "max_tokens": 16}
            pid = client_load(self, ctx, [], rate=rate, fresh=fresh)
        else:
            if completions:
                specs = [completions_request(make_prompt(32, rng=rng), 16) for _ in range(n)]
            else:
                specs = [embeddings_request(make_prompt(24, rng=rng)) for _ in range(n)]
            pid = client_load(self, ctx, specs, rate=rate)
        return FaultEffect(client_url=ctx.target, details={"pid": pid, "rate": rate})
