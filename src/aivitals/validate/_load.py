"""Background load for a validation phase: streaming completions plus cached embeddings,
or, against a user's service (``--target``), its own request template."""

from __future__ import annotations

import dataclasses
import random
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..load import RequestSpec, RequestTemplate

__all__ = ["LoadPhase", "LoadPlan", "impatient_requests", "template_requests"]

#: Distinct prompts a template's load cycles through: more than a quick case sends at
#: the plan's rate, so a response cache of the service misses as it does on new inputs.
TEMPLATE_POOL = 2048


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """Requests per second of each kind; small enough for two cores."""

    completions_rate: float = 2.0
    embeddings_rate: float = 2.0
    max_tokens: int = 12
    prompt_tokens: int = 24
    #: an impatient client's share of the completions (taken from the normal stream)
    impatient_rate: float = 1.0
    #: its generations' length and the deadline it sends: 256 tokens take about 1.1 s
    #: on the development machine's CPU, so a machine 3x faster still misses 0.3 s
    impatient_tokens: int = 256
    impatient_deadline_s: float = 0.3
    #: distinct impatient prompts, cycled: more than a fault phase sends at its rate
    impatient_pool: int = 1024
    #: distinct embeddings inputs, the same in every phase (a cache warm from the start)
    embeddings_pool: int = 16
    embeddings_seed: int = 0


def impatient_requests(plan: LoadPlan, rng: random.Random) -> tuple[RequestSpec, ...]:
    """The impatient client's requests: long generations that give up early, each different.

    Each prompt is new (drawn from ``rng``): with one fixed prompt, a generation that
    finished inside its deadline (a fast machine) is cached, and every later request is
    a cache hit that never reaches the model, so no deadline ever passes (0 timeouts, no
    pile-up).
    """
    from ..load import completions_request, make_prompt

    out = []
    for _ in range(plan.impatient_pool):
        spec = completions_request(make_prompt(32, rng=rng), plan.impatient_tokens, stream=False)
        headers = (*spec.headers, ("X-Request-Timeout", f"{plan.impatient_deadline_s:g}"))
        out.append(dataclasses.replace(spec, headers=headers))
    return tuple(out)


def template_requests(
    template: RequestTemplate,
    n: int,
    *,
    prompt_tokens: int = LoadPlan().prompt_tokens,
    rng: random.Random | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> tuple[RequestSpec, ...]:
    """``n`` requests of the user's template, each with a new prompt of
    ``prompt_tokens`` words, ``headers`` added."""
    from ..load import make_prompt

    rng = rng or random.Random()
    out = []
    for _ in range(n):
        spec = template.render(make_prompt(prompt_tokens, rng=rng))
        if headers:
            spec = dataclasses.replace(spec, headers=(*spec.headers, *headers))
        out.append(spec)
    return tuple(out)


@dataclass
class LoadPhase:
    """Load running on threads until ``stop()``; then ``reports`` holds what each saw.

    **Usage**::

        phase = LoadPhase(base_url, LoadPlan()).start(max_seconds=60)
        ...
        phase.stop()
        phase.reports["completions"].e2e.p99_ms

    With ``template`` (a user's service) one stream sends the template's request at the
    plan's two rates together, every prompt new: ``reports["requests"]``.
    """

    base_url: str
    plan: LoadPlan
    allow_hosts: tuple[str, ...] = ()
    impatient: bool = False
    template: RequestTemplate | None = None
    reports: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    @property
    def main(self) -> str:
        """The stream whose report says what the clients felt."""
        return "completions" if self.template is None else "requests"

    def start(self, *, max_seconds: float) -> LoadPhase:
        from ..load import LoadConfig

        url = self.base_url.rstrip("/")
        p = self.plan
        if self.template is not None:
            return self._start_threads(self._template_configs(url, max_seconds))
        # The impatient client replaces part of the completions, so the request rate stays
        # what it was: added on top it raised the rate by half, which read as a traffic
        # surge and contradicted timeouts_not_aborting's own finding.
        completions_rate = p.completions_rate - (p.impatient_rate if self.impatient else 0.0)
        configs = {
            # every prompt new (input_pool 0, no seed), in every phase: each completion
            # reaches the model (the cache looks it up and misses)
            "completions": LoadConfig(
                url=url + "/v1/completions",
                rate=completions_rate,
                duration=max_seconds,
                max_tokens=p.max_tokens,
                prompt_tokens=p.prompt_tokens,
                allow_hosts=self.allow_hosts,
                timeout=10.0,
                input_pool=0,
            ),
            # the same 16 inputs in every phase (a fixed seed), as a steady workload repeats
            # itself: new random inputs at each phase's start (a fault's start) found the
            # cache cold, and that drop of the hit ratio read as a cache stampede
            "embeddings": LoadConfig(
                url=url + "/v1/embeddings",
                rate=p.embeddings_rate,
                duration=max_seconds,
                input_pool=p.embeddings_pool,
                seed=p.embeddings_seed,
                allow_hosts=self.allow_hosts,
                timeout=10.0,
            ),
        }
        if self.impatient:
            configs["impatient"] = LoadConfig(
                url=url + "/v1/completions",
                rate=p.impatient_rate,
                duration=max_seconds,
                requests=impatient_requests(p, random.Random()),
                allow_hosts=self.allow_hosts,
                timeout=10.0,
            )
        return self._start_threads(configs)

    def _template_configs(self, url: str, max_seconds: float) -> dict[str, Any]:
        """The user's request at the plan's whole rate; an impatient client sends it with
        the deadline header (``X-Request-Timeout``) in place of part of it."""
        from ..load import LoadConfig

        assert self.template is not None
        p, t = self.plan, self.template
        rate = p.completions_rate + p.embeddings_rate
        rate -= p.impatient_rate if self.impatient else 0.0
        configs = {
            "requests": LoadConfig(
                url=url + t.path,
                rate=rate,
                duration=max_seconds,
                requests=template_requests(t, TEMPLATE_POOL),
                allow_hosts=self.allow_hosts,
                timeout=10.0,
            )
        }
        if self.impatient:
            deadline = (("X-Request-Timeout", f"{p.impatient_deadline_s:g}"),)
            configs["impatient"] = LoadConfig(
                url=url + t.path,
                rate=p.impatient_rate,
                duration=max_seconds,
                requests=template_requests(t, p.impatient_pool, headers=deadline),
                allow_hosts=self.allow_hosts,
                timeout=10.0,
            )
        return configs

    def _start_threads(self, configs: dict[str, Any]) -> LoadPhase:
        for name, cfg in configs.items():
            t = threading.Thread(target=self._run, args=(name, cfg), daemon=True, name=name)
            self._threads.append(t)
            t.start()
        return self

    def _run(self, name: str, cfg: Any) -> None:
        from ..load import run_load

        try:
            self.reports[name] = run_load(cfg, stop=self._stop)
        except Exception as exc:  # a load failure is reported, not raised into the run
            self.errors.append(f"{name}: {type(exc).__name__}: {exc}")

    def stop(self, timeout: float = 40.0) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout)
