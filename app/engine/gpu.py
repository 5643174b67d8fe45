"""The device the step-level engine runs on: :class:`GpuSpec`, one card (or the CPU
build's host). The planner's catalog (app/planner/data/gpus.yaml, app.planner.gpus)
fills it for a named card; the step-time model (:mod:`app.engine.steptime`) reads its
bandwidth, compute and links.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

#: bytes per GiB
GIB = 2**30


@dataclass(frozen=True)
class GpuSpec:
    """One card. Units: ``memory_gib`` total as NVML reports it (GiB); ``busy_gib`` memory
    not free before the launch (GiB): other processes' allocations and, from NVML, the
    driver's reservation (total − free); ``bandwidth_gbs`` GB/s (10^9 B/s);
    ``tflops_bf16`` dense FP16/BF16 tensor TFLOPS; ``cc`` compute capability (8.9);
    ``nvlink_gbs`` GB/s, 0 if none; ``tdp_w`` W. ``kind`` is ``"gpu"`` or ``"cpu"`` (the
    CPU build of vLLM, whose KV space is ``VLLM_CPU_KVCACHE_SPACE``)."""

    name: str
    memory_gib: float
    bandwidth_gbs: float
    tflops_bf16: float
    fp8: bool = False
    cc: float = 8.0
    pcie_gen: int = 4
    nvlink_gbs: float = 0.0
    p2p: bool = False
    tdp_w: float = 0.0
    memory_gb: float | None = None
    busy_gib: float = 0.0
    kind: str = "gpu"
    nvml_names: tuple[str, ...] = ()
    assumed: tuple[str, ...] = ()

    @property
    def free_gib(self) -> float:
        """Memory free before the launch (total − busy_gib), GiB."""
        return max(0.0, self.memory_gib - self.busy_gib)

    @property
    def capability(self) -> int:
        """Compute capability as vLLM writes it: 8.9 → 89."""
        return int(round(self.cc * 10))

    @property
    def pcie_gbs(self) -> float:
        """Usable PCIe bandwidth one way, GB/s (x16 link; ≈ 80 % of the raw rate)."""
        return {3: 12.0, 4: 25.0, 5: 50.0}.get(self.pcie_gen, 25.0)

    def with_memory(self, memory_gib: float | None = None, busy_gib: float | None = None) -> "GpuSpec":
        """A copy with NVML's own total and/or the memory other processes hold (GiB)."""
        return replace(
            self,
            memory_gib=self.memory_gib if memory_gib is None else float(memory_gib),
            busy_gib=self.busy_gib if busy_gib is None else float(busy_gib),
        )


@dataclass(frozen=True)
class LinkSpec:
    """One inter-host link (the network between the machines of a rig), from the link
    catalog (app/planner/data/gpus.yaml ``links:``, app.planner.gpus.lookup_link).

    ``name`` the catalog key (``ib-hdr200``); ``line_gbps`` the standard's line rate,
    Gb/s; ``bandwidth_gbs`` the achievable payload bandwidth one way, GB/s (10^9 B/s) —
    what NCCL's bus bandwidth reaches over it; ``latency_us`` the one-way latency of a
    small message host to host, µs (NIC + switch + transport). ``title`` the name in
    words."""

    name: str
    title: str
    line_gbps: float
    bandwidth_gbs: float
    latency_us: float

    @property
    def latency_s(self) -> float:
        return self.latency_us * 1e-6


@dataclass(frozen=True)
class RigLayout:
    """How a rig's cards sit in machines: ``hosts`` machines × ``cards_per_host`` cards
    each, joined by ``link`` (None: one host, no network). Ranks fill the hosts in
    order (rank r on host r // cards_per_host), as vLLM's multi-node launch places them
    (TP innermost, then PP, then DP; app.hosts.plan)."""

    hosts: int = 1
    cards_per_host: int = 1
    link: LinkSpec | None = None

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1 and self.link is not None

    def host_of(self, rank: int) -> int:
        """The host (0-based) that holds global rank ``rank``."""
        return rank // max(1, self.cards_per_host) if self.multi_host else 0

    def describe(self) -> str:
        """``4 hosts × 1 card, InfiniBand HDR 200 Gb/s``."""
        cards = f"{self.cards_per_host} card" + ("s" if self.cards_per_host != 1 else "")
        hosts = f"{self.hosts} host" + ("s" if self.hosts != 1 else "")
        return f"{hosts} × {cards}" + (f", {self.link.title}" if self.link is not None and self.hosts > 1 else "")
