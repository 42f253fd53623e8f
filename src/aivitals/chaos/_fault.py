"""The ``Fault`` base class and the context a fault runs in."""

from __future__ import annotations

import abc
import json
import math
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..errors import ConfigError, FaultError, FaultRefused
from ..load import DEMO_EMBEDDINGS, RequestTemplate, check_target, split_url
from ._journal import Entry, Journal, Replacement, RunDir, revert_entry
from ._procs import python_helper, spawn, start_time
from ._spec import FaultSpec
from ._table import FaultInfo

__all__ = ["DEFAULT_MAX_DURATION", "Fault", "FaultContext", "FaultEffect", "Param", "Touch"]

#: Longest a fault may run unless the runner is configured otherwise, seconds.
DEFAULT_MAX_DURATION = 900.0

#: (default, minimum, maximum) of a numeric fault parameter.
Param = tuple[float, float, float]


@dataclass(frozen=True, kw_only=True)
class FaultContext:
    """What a fault may act on. Everything is optional; a fault names what it needs.

    **Usage**::

        ctx = FaultContext(target="http://127.0.0.1:8000", service_pid=1234,
                           chaos_token="s3cret-token", sim_gpu_dir=Path("/tmp/aivitals-sim-gpu"),
                           redis_port=6390)

    ``target`` is the service's base URL (loopback unless ``allow_hosts`` names
    its host), ``chaos_token`` opens the service's in-process chaos endpoint,
    ``work_dir`` is where disk faults write (default: the run directory),
    ``base_rate`` is the normal request rate a traffic surge multiplies,
    ``request`` what one request to the service looks like (every fault that sends
    requests takes its method, path, headers and body from it; the demo's
    embeddings by default).

    Who owns the processes named here (``redis_pid``, ``service_pid``): ``owner``
    is the ledger directory (a ``RunDir`` of kind ``"stack"``) of whoever started
    them. A fault that replaces one of them (``redis_down`` ``method=1`` kills
    redis-server and starts a new one on revert) writes the new process into
    that ledger and calls ``on_replace`` with it, so the owner stops it as its
    own. Without an owner such a fault is refused, unless
    ``allow_foreign_restart`` says the caller takes the new process (it is then
    reported, and left running as the original was).
    """

    target: str | None = None
    service_pid: int | None = None
    sim_gpu_dir: Path | None = None
    gpu: int = 0
    redis_port: int | None = None
    redis_pid: int | None = None
    chaos_token: str | None = None
    work_dir: Path | None = None
    allow_hosts: tuple[str, ...] = ()
    base_rate: float = 10.0
    request: RequestTemplate = DEMO_EMBEDDINGS
    owner: Path | None = None
    on_replace: Callable[[Replacement], None] | None = field(default=None, compare=False)
    allow_foreign_restart: bool = False
    run: RunDir | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.target is not None:
            check_target(self.target, self.allow_hosts)
        if not self.base_rate > 0:
            raise ConfigError(f"base_rate: {self.base_rate!r} must be > 0")

    @property
    def host_port(self) -> tuple[str, int]:
        host, port, _ = split_url(self.require("target"))
        return host, port

    def require(self, name: str) -> Any:
        value = getattr(self, name)
        if value is None:
            raise FaultRefused(f"this fault needs {name} in its context (not given)")
        return value


@dataclass
class FaultEffect:
    """What a started fault tells its caller: the URL clients should use while it
    runs (a network fault puts a lossy or slow path in front of the service), the
    hosts that URL needs allowed, and details for the report."""

    client_url: str | None = None
    allow_hosts: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Touch:
    """What a fault touches for one value of a parameter, and who owns it afterwards.

    ``when`` is ``""`` for every value, or ``"method=1"``; ``processes`` says the
    fault starts or restarts processes (a SIGKILL of the runner then leaves them
    to ``aivitals chaos cleanup``).
    """

    when: str
    touches: str
    afterwards: str
    processes: bool = False


class Fault(abc.ABC):
    """One injectable fault with a bounded duration and a guaranteed revert.

    Subclasses set ``name`` (a row of the fault table gives its layer,
    description, expected signature and alerts), ``params`` and implement
    ``_start``; every resource they create goes through ``self.record`` first,
    so ``stop`` (and a later ``aivitals chaos cleanup``) can undo it.

    **Usage** (normally through ``ChaosRunner``)::

        fault = get_fault("cpu_burn")(duration=30, workers=2)
    """

    name: ClassVar[str]
    #: everything else aivitals knows about the fault (``_spec``); the registry lists
    #: the classes that have one
    spec: ClassVar[FaultSpec]
    params: ClassVar[dict[str, Param]] = {}
    #: Parameters whose values select a different mechanism (each value listed).
    choices: ClassVar[dict[str, tuple[int, ...]]] = {}
    #: What it touches and who owns that afterwards, per value of ``choices``.
    touches: ClassVar[tuple[Touch, ...]] = ()
    #: Parameters passed through without a numeric check (the service validates them).
    free_params: ClassVar[bool] = False

    def __init__(
        self, *, duration: float, max_duration: float = DEFAULT_MAX_DURATION, **params: Any
    ) -> None:
        if not isinstance(duration, int | float) or not math.isfinite(duration) or duration <= 0:
            raise FaultRefused(f"fault {self.name!r}: duration {duration!r} must be > 0 seconds")
        if duration > max_duration:
            raise FaultRefused(
                f"fault {self.name!r}: duration {duration:g}s is longer than the configured "
                f"maximum {max_duration:g}s"
            )
        self.duration = float(duration)
        self.values = params if self.free_params else self._validate(params)
        self._journal: Journal | None = None
        self._entries: list[Entry] = []
        self._lock = threading.Lock()
        self._revert_lock = threading.RLock()
        self._stopped = threading.Event()
        self.started = False
        self.run: RunDir | None = None
        self._procs: list[subprocess.Popen[bytes]] = []
        self._on_replace: Callable[[Replacement], None] | None = None
        #: processes the revert started in place of ones the fault stopped
        self.replacements: list[Replacement] = []

    # -- the table row ------------------------------------------------------------
    @classmethod
    def info(cls) -> FaultInfo:
        return FaultInfo.of(cls.spec)

    @property
    def layer(self) -> str:
        return self.info().layer

    @property
    def description(self) -> str:
        return self.info().description

    @property
    def expected_signature(self) -> str | None:
        return self.info().signature

    @property
    def expected_alerts(self) -> tuple[str, ...]:
        return self.info().alerts

    @classmethod
    def touches_for(cls, **values: float) -> list[Touch]:
        """The ``touches`` rows that apply to these values of ``choices`` (defaults
        for the ones not given)."""
        chosen = {k: int(values.get(k, cls.params[k][0])) for k in cls.choices}
        wanted = {""} | {f"{k}={v}" for k, v in chosen.items()}
        return [t for t in cls.touches if t.when in wanted]

    # -- lifecycle -----------------------------------------------------------------
    def start(self, ctx: FaultContext) -> FaultEffect:
        """Inject the fault. ``ctx.run`` must be set (``ChaosRunner`` does it)."""
        if ctx.run is None:
            raise FaultError(f"fault {self.name!r}: start it through ChaosRunner (no run dir)")
        if self.started:
            raise FaultError(f"fault {self.name!r} was already started")
        self._journal = ctx.run.journal
        self.run = ctx.run
        self._on_replace = ctx.on_replace
        self.started = True
        try:
            return self._start(ctx)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> list[str]:
        """Revert everything this fault created, newest first. Idempotent; returns
        the errors met (the rest is still reverted)."""
        self._stopped.set()
        self._before_stop()
        errors: list[str] = []
        # Held for the whole revert: a second caller (the duration timer, a signal
        # handler, close) returns only once everything is undone.
        with self._revert_lock:
            with self._lock:
                entries, self._entries = self._entries, []
            for entry in reversed(entries):
                assert self._journal is not None
                try:
                    rep = revert_entry(entry, self.run)
                except Exception as exc:  # keep reverting the rest
                    errors.append(f"{self.name}: {entry['kind']}: {exc}")
                    if entry["kind"] == "restart":
                        # rolled back by the restart itself: nothing for a later cleanup
                        self._journal.mark_reverted(entry["id"])
                    continue
                self._journal.mark_reverted(entry["id"])
                if rep is not None:
                    self.replacements.append(rep)
                    errors += self._hand_back(rep)
        return errors

    def _hand_back(self, rep: Replacement) -> list[str]:
        if self._on_replace is None:
            return []
        try:
            self._on_replace(rep)
        except Exception as exc:  # the owner's ledger already holds it; report, go on
            return [f"{self.name}: handing {rep.role} pid {rep.pid} back: {exc}"]
        return []

    def record(self, kind: str, **data: Any) -> None:
        """Write a resource to the journal before creating it."""
        assert self._journal is not None
        entry_id = self._journal.record(kind, owner=self.name, **data)
        with self._lock:
            self._entries.append({"id": entry_id, "kind": kind, **data})

    def spawn(self, argv: list[str], *, label: str, netns: str | None = None) -> int:
        """Start a helper process (own session, run marker, own log) and record it."""
        assert self.run is not None
        proc = spawn(argv, run_id=self.run.run_id, log=self.run.path / f"{label}.log", netns=netns)
        self.record("process", pid=proc.pid, start=start_time(proc.pid), label=label)
        self._procs.append(proc)
        return proc.pid

    def helper(self, kind: str, label: str, **args: Any) -> int:
        """Start one of ``aivitals.chaos._helpers`` with ``args`` and a deadline."""
        assert self.run is not None
        args.setdefault("deadline", self.deadline_epoch)
        # Through a file: request bodies can pass the kernel's argument size limit.
        path = self.run.path / f"{label}-args.json"
        path.write_text(json.dumps(args))
        return self.spawn(python_helper(kind, f"@{path}"), label=label)

    def helper_alive(self) -> bool:
        return any(p.poll() is None for p in self._procs)

    @property
    def deadline_epoch(self) -> float:
        """When helper processes must end on their own (duration plus a grace)."""
        import time

        return time.time() + self.duration + 10.0

    @abc.abstractmethod
    def _start(self, ctx: FaultContext) -> FaultEffect: ...

    def _before_stop(self) -> None:  # noqa: B027 (an optional hook, empty by default)
        """Hook for faults with threads: tell them to end before the revert."""

    # -- params ----------------------------------------------------------------------
    def _validate(self, given: dict[str, Any]) -> dict[str, float]:
        unknown = sorted(set(given) - set(self.params))
        if unknown:
            allowed = ", ".join(sorted(self.params)) or "none"
            raise ConfigError(f"fault {self.name!r}: unknown params {unknown} (allowed: {allowed})")
        out = {}
        for key, (default, low, high) in self.params.items():
            raw = given.get(key, default)
            if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
                raise ConfigError(f"fault {self.name!r}: {key}={raw!r} is not a finite number")
            if not low <= raw <= high:
                raise ConfigError(f"fault {self.name!r}: {key}={raw!r} outside [{low:g}, {high:g}]")
            out[key] = float(raw)
        return out
