"""Background load for a validation phase: streaming completions plus cached embeddings."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoadPhase", "LoadPlan"]


@dataclass(frozen=True, slots=True)
class LoadPlan:
    """Requests per second of each kind; small enough for two cores."""

    completions_rate: float = 2.0
    embeddings_rate: float = 2.0
    max_tokens: int = 12
    prompt_tokens: int = 24
    #: an impatient client's share of the completions (taken from the normal stream)
    impatient_rate: float = 1.0
    #: distinct embeddings inputs, the same in every phase (a cache warm from the start)
    embeddings_pool: int = 16
    embeddings_seed: int = 0


@dataclass
class LoadPhase:
    """Load running on threads until ``stop()``; then ``reports`` holds what each saw.

    **Usage**::

        phase = LoadPhase(base_url, LoadPlan()).start(max_seconds=60)
        ...
        phase.stop()
        phase.reports["completions"].e2e.p99_ms
    """

    base_url: str
    plan: LoadPlan
    allow_hosts: tuple[str, ...] = ()
    impatient: bool = False
    reports: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self, *, max_seconds: float) -> LoadPhase:
        from ..load import LoadConfig, completions_request, make_prompt

        url = self.base_url.rstrip("/")
        p = self.plan
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
            spec = completions_request(make_prompt(32), 256, stream=False)
            spec = type(spec)(
                spec.method,
                spec.path,
                spec.body,
                (*spec.headers, ("X-Request-Timeout", "0.8")),
                stream=False,
                prompt_tokens=spec.prompt_tokens,
                expects_json=True,
            )
            configs["impatient"] = LoadConfig(
                url=url + "/v1/completions",
                rate=p.impatient_rate,
                duration=max_seconds,
                requests=(spec,),
                allow_hosts=self.allow_hosts,
                timeout=10.0,
            )
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
