"""The collectors an ``AgentConfig`` asks for."""

from __future__ import annotations

from ..collect import (
    Collector,
    HostCollector,
    HTTPProbeCollector,
    KernelLogCollector,
    PodResolver,
    ProcessCollector,
    pod_source,
)
from ..collect.gpu import NvmlBackend, gpu_collector
from ._config import AgentConfig

__all__ = ["build_collectors"]


def build_collectors(config: AgentConfig) -> list[Collector]:
    """host, process (with pid or port), gpu (unless none is found), kernel log, probes,
    extras."""
    ports = [*config.tcp_ports, *([config.port] if config.port else [])]
    out: list[Collector] = [
        HostCollector(proc=config.proc, sys=config.sys, ports=ports, netns=config.netns)
    ]
    if config.pid is not None or config.port is not None:
        out.append(ProcessCollector(pid=config.pid, port=config.port, proc=config.proc))
    # The sim directory is resolved only for the sim backend: resolving it reads the
    # temp dir, which a read-only container root (the DaemonSet) may not have.
    sim_dir = config.sim_dir if config.gpu == "sim" else None
    # pod labels from the processes' cgroups always (a local read); names only from a
    # source the configuration gives
    source = pod_source(config.kubelet_pods) if config.kubelet_pods else None
    pods = PodResolver(proc_root=config.proc, source=source)
    gpu = gpu_collector(config.gpu, sim_dir=sim_dir, pods=pods)
    if gpu is not None:
        out.append(gpu)
    if config.kernel_log:
        pci: dict[str, str] = {}
        if gpu is not None and isinstance(gpu.backend, NvmlBackend):
            pci = gpu.backend.pci_bus_ids  # so kernel Xids carry the same gpu index
        out.append(KernelLogCollector(pci_to_gpu=pci))
    if config.probes:
        out.append(HTTPProbeCollector(config.probes, timeout=config.probe_deadline))
    out += config.extra_collectors
    return out
