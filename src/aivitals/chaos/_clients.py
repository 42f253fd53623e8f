"""Faults made of client traffic: over-long inputs, malformed inputs, a surge.

Each runs the load generator in a helper process, so a crash of the runner
cannot leave it sending, and the runner's own timing is not disturbed. What they
send is the context's request template (``FaultContext.request``): its method, path
and headers, with the fault's input where the template's ``{{prompt}}`` goes.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError
from ..load import DEMO_COMPLETIONS, DEMO_EMBEDDINGS, RequestSpec, RequestTemplate, make_prompt
from ._fault import Fault, FaultContext, FaultEffect, Touch
from ._spec import (
    FaultSpec,
    Grading,
    Knob,
    Needs,
    PhaseWindow,
    Runs,
    SweepBasis,
    no_data,
    peak,
    up,
)

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

#: The most fresh requests a surge renders itself, for a template the load generator
#: cannot build (they travel base64 in the helper's args file, about 0.3 KB each).
_MAX_RENDERED_SENDS = 200_000

#: Every client-traffic fault: one load-generator helper of the run.
_CLIENT = Touch(
    "",
    "starts a load-generator helper process sending requests to the service",
    "the run: stopped at revert (and at its own deadline); cleanup stops it after a crash",
    processes=True,
)


# -- bad inputs: InputRejectionsHigh, the refused share of all requests per reason -------
def _rejections(per_reason: float, why: str) -> Grading:
    def knob(b: SweepBasis) -> Knob:
        share, rate = b.pack.input_rejection_ratio, b.request_rate
        # per_reason * r / (r + rate) = share  ->  r = share * rate / (per_reason - share)
        return Knob(
            param="rate",
            unit="share of requests refused (one reason)",
            bound=share,
            source=f"InputRejectionsHigh input_rejection_ratio {share:g}; {rate:g} other "
            f"requests/s; {why}",
            threshold={"rate": up(share * rate / (per_reason - share), 0.01)},
            moderate={"rate": up(2 * share * rate / (per_reason - 2 * share), 0.01)},
        )

    def magnitude(p: Mapping[str, Any], b: SweepBasis) -> float:
        r = float(p["rate"])
        return per_reason * r / (r + b.request_rate)

    def measure(w: PhaseWindow, b: SweepBasis) -> float | str:
        return peak(
            w.end(
                "max(sum by (reason) (increase(input_rejections_total[W]))) "
                "/ sum(increase(http_request_duration_seconds_count[W]))"
            ),
            "input_rejections_total",
        )

    return Grading(knob=knob, magnitude=magnitude, measure=measure)


OVERLONG_INPUTS = FaultSpec(
    name="overlong_inputs",
    layer="business",
    description="one client sends 100,000-character inputs",
    alerts=("InputRejectionsHigh",),
    signature="overlong_inputs",
    needs=Needs("outside"),
    runs=Runs(error_codes=("INPUT_TOO_LARGE",)),
    grading=_rejections(1.0, "every request refused as too large"),
)


class OverlongInputs(Fault):
    """One client sending ``chars``-character inputs where the template's prompt goes."""

    name = "overlong_inputs"
    spec = OVERLONG_INPUTS
    params = {"chars": (100_000, 1_000, 10_000_000), "rate": (5, 0.1, 1000)}
    touches = (_CLIENT,)

    def _start(self, ctx: FaultContext) -> FaultEffect:
        text = "lorem ipsum dolor sit amet " * (int(self.values["chars"]) // 27 + 1)
        spec = ctx.request.render(text[: int(self.values["chars"])])
        pid = client_load(self, ctx, [spec], rate=self.values["rate"])
        return FaultEffect(client_url=ctx.target, details={"pid": pid})


def malformed_requests(template: RequestTemplate) -> list[RequestSpec]:
    """What one misbehaving client sends, in the template's request: control characters
    (as JSON escapes and raw), invalid UTF-8, full-width digits, a truncated body. On
    the demo's template these are the bytes of ``MALFORMED_BODIES``."""
    return [
        template.render_raw(json.dumps("hello \x00\x01\x02 world \x1b[31m")[1:-1].encode()),
        template.render_raw(b"caf\xc3 \xff\xfe invalid utf-8 \xed\xa0\x80"),
        template.render_raw("\uff11\uff12\uff13 full-width digits".encode()),
        template.render_raw(b"\x07\x08 raw control chars \x0b\x0c"),
        template.render_raw(b"truncated", truncate=True),
    ]


#: The demo's malformed bodies, as the fault sent them before it took a template.
MALFORMED_BODIES: tuple[bytes, ...] = tuple(r.body for r in malformed_requests(DEMO_EMBEDDINGS))


#: Of the five bodies, two are refused for the same reason, control characters (one as
#: JSON escapes, one raw); the others as invalid UTF-8, broken JSON or full-width text.
#: InputRejectionsHigh is per reason.
MALFORMED_TOP_REASON_SHARE = 2 / 5

MALFORMED_INPUTS = FaultSpec(
    name="malformed_inputs",
    layer="business",
    description="one client sends control characters and invalid UTF-8",
    alerts=("InputRejectionsHigh",),
    signature="malformed_inputs",
    needs=Needs("outside"),
    runs=Runs(error_codes=("INPUT_CONTROL_CHARS", "INPUT_INVALID_UTF8")),
    grading=_rejections(
        MALFORMED_TOP_REASON_SHARE, f"{MALFORMED_TOP_REASON_SHARE:g} of them for the same reason"
    ),
)


class MalformedInputs(Fault):
    """One client sending control characters, invalid UTF-8 and broken JSON."""

    name = "malformed_inputs"
    spec = MALFORMED_INPUTS
    params = {"rate": (10, 0.1, 1000)}
    touches = (_CLIENT,)

    def _start(self, ctx: FaultContext) -> FaultEffect:
        specs = malformed_requests(ctx.request)
        pid = client_load(self, ctx, specs, rate=self.values["rate"])
        return FaultEffect(client_url=ctx.target, details={"pid": pid})


# -- traffic_surge -----------------------------------------------------------------------
# Its expected alerts (QueueBacklog, HTTP429RateHigh) judge the load against the service's
# capacity, not against the rate before it. Past capacity the queue fills, and once it is
# full the share refused is 1 - 1/load: HTTP429RateHigh's http_429_ratio is just crossed
# at load 1 / (1 - ratio). The surge's fresh embeddings inputs are sized against the
# worker pool's capacity the run measures (``SweepBasis.pool``); the knob, before a run,
# against the nominal one.
def surge_load(factor: float, b: SweepBasis) -> float:
    """The load a surge of ``factor`` offers the worker pool, as a multiple of its
    capacity: validate's completions and the surge's fresh embeddings (validate's own
    embeddings are cache hits and cost the pool nothing)."""
    workers, per_embedding, per_completion = b.pool
    work = b.completions_rate * per_completion + factor * b.base_rate * per_embedding
    return work / workers


def surge_factor(load: float, b: SweepBasis) -> float:
    """The surge factor that offers ``load`` (x capacity), rounded up to the fault's
    0.1 step, at least its smallest (the inverse of ``surge_load``)."""
    workers, per_embedding, per_completion = b.pool
    room = load * workers - b.completions_rate * per_completion
    factor = room / (b.base_rate * per_embedding)
    return max(_smallest_surge(), up(factor, 0.1))


def _smallest_surge() -> float:
    return float(TrafficSurge.params["factor"][1])


def _surge_limit(b: SweepBasis) -> float:
    return 1.0 / (1.0 - b.pack.http_429_ratio)


def _surge_knob(b: SweepBasis) -> Knob:
    limit, ratio = _surge_limit(b), b.pack.http_429_ratio
    return Knob(
        param="factor",
        unit="offered load on the worker pool (x its measured capacity)",
        bound=limit,
        source=f"HTTP429RateHigh http_429_ratio {ratio:g}: past the pool's capacity "
        f"QueueBacklog's queue fills, then 1/(1 - {ratio:g}) = {limit:.3f} x capacity "
        f"refuses that share; the fault adds factor x {b.base_rate:g} fresh embeddings/s "
        f"to validate's {b.request_rate:g} requests/s",
        threshold={"factor": surge_factor(limit, b)},
        moderate={"factor": surge_factor(2 * limit, b)},
        note=f"sized at run time against the pool's measured capacity (here the nominal "
        f"{b.nominal_embeddings_rps:g} embeddings/s); the fault's smallest surge is "
        f"factor {_smallest_surge():g}",
    )


def _surge_at(severity: str, today: Mapping[str, Any], b: SweepBasis) -> dict[str, Any]:
    """A surge at ``severity`` against the pool of ``b``: the load of the threshold,
    twice it, and today's factor unless a larger pool makes that less than moderate's
    load (then twice moderate's)."""
    limit, factor = _surge_limit(b), float(today["factor"])
    if severity == "threshold":
        factor = surge_factor(limit, b)
    elif severity == "moderate":
        factor = surge_factor(2 * limit, b)
    elif surge_load(factor, b) < surge_load(surge_factor(2 * limit, b), b):
        factor = surge_factor(4 * limit, b)
    return {**today, "factor": factor}


def _surge_measure(w: PhaseWindow, b: SweepBasis) -> float | str:
    """The load offered to the worker pool over the phase (x its capacity): the requests
    that arrived, answered or refused, less the embeddings the cache answered."""
    workers, per_embedding, per_completion = b.pool
    arrived = 'sum(rate(http_request_duration_seconds_count{{route="/v1/{}"}}[W]))'
    completions = w.end(arrived.format("completions"))
    embeddings = w.end(arrived.format("embeddings"))
    hits = w.end('sum(rate(cache_requests_total{cache="embeddings",result="hit"}[W]))')
    if not completions or not embeddings:
        return no_data("http_request_duration_seconds_count")
    fresh = max(0.0, embeddings[0] - (hits[0] if hits else 0.0))
    return (completions[0] * per_completion + fresh * per_embedding) / workers


TRAFFIC_SURGE = FaultSpec(
    name="traffic_surge",
    layer="service",
    description="a burst of requests at N times the normal rate",
    alerts=("QueueBacklog", "HTTP429RateHigh"),
    signature="traffic_surge",
    hurts_clients=True,  # the normal clients queue behind the burst or get 429
    consequences={
        "QueueWaitHigh": "a surge past the pool's capacity fills the queue in front of the "
        "workers, and requests wait in it",
        "WorkerPoolSaturated": "a surge past the pool's capacity keeps every worker busy",
        "GPUUtilizationHigh": "a saturated pool keeps the model computing all the time, and "
        "the device busy",
        "CacheHitRatioDrop": "the surge's distinct inputs all miss, and the 429s it causes "
        "refuse validate's repeated inputs, so hits fall along with the ratio",
        # a GPU engine batches a surge into larger, slower batches
        "InferenceLatencyHigh": "the CPU-run model shares its process (the GIL) and the "
        "cores with the surge's HTTP work, so each inference takes longer",
    },
    needs=Needs("outside"),
    runs=Runs(params={"factor": 10}, quick_params={"factor": 20}, quick_fault_max=40.0),
    grading=Grading(
        knob=_surge_knob,
        magnitude=lambda p, b: surge_load(float(p["factor"]), b),
        measure=_surge_measure,
        at=_surge_at,
    ),
)


class TrafficSurge(Fault):
    """Extra open-loop load at ``factor`` times the context's ``base_rate``, each request
    the context's template (the demo's ``/v1/embeddings`` by default; ``completions`` 1
    for the demo's streaming completions instead).

    A surge is new traffic: by default (``distinct`` 0) every request carries a
    prompt of its own, so a response cache in front of the model does not absorb
    it as it would a replay. ``distinct`` N cycles N prompts instead: a cache then
    learns them, and the surge fades once it has (at x10, 4096 cycled prompts are all
    cache hits within five minutes).
    """

    name = "traffic_surge"
    spec = TRAFFIC_SURGE
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
        template = _surge_template(ctx.request, bool(self.values["completions"]))
        tokens = 32 if template == DEMO_COMPLETIONS else 24
        rate = self.values["factor"] * ctx.base_rate
        if n == 0:
            # The load generator makes one request per send time before it starts
            # (about 1 KB each): refuse a surge that would hold gigabytes of them.
            sends = rate * (self.duration + 10.0)
            # The helper's generator makes fresh inputs only in the demo's two requests;
            # any other template's are rendered here and travel in its args file.
            built = template in (DEMO_EMBEDDINGS, DEMO_COMPLETIONS)
            most = _MAX_FRESH_SENDS if built else _MAX_RENDERED_SENDS
            if sends > most:
                raise ConfigError(
                    f"fault 'traffic_surge': {rate:g}/s for {self.duration:g} s is "
                    f"{sends:,.0f} distinct requests (at most {most:,} with "
                    f"{template.describe()}); shorten the fault or set distinct to cycle "
                    "that many prompts"
                )
            if built:
                fresh = {"path": template.path, "prompt_tokens": tokens, "max_tokens": 16}
                pid = client_load(self, ctx, [], rate=rate, fresh=fresh)
            else:
                specs = [template.render(make_prompt(tokens, rng=rng)) for _ in range(int(sends))]
                pid = client_load(self, ctx, specs, rate=rate)
        else:
            specs = [template.render(make_prompt(tokens, rng=rng)) for _ in range(n)]
            pid = client_load(self, ctx, specs, rate=rate)
        return FaultEffect(client_url=ctx.target, details={"pid": pid, "rate": rate})


def _surge_template(request: RequestTemplate, completions: bool) -> RequestTemplate:
    """What the surge sends: the context's template; ``completions`` 1 picks the demo's
    streaming completions instead, so it is refused with a template of the user's."""
    if not completions:
        return request
    if request != DEMO_EMBEDDINGS:
        raise ConfigError(
            "fault 'traffic_surge': completions=1 picks the demo's streaming completions; "
            f"with a request template ({request.describe()}) the template says what to send"
        )
    return DEMO_COMPLETIONS
