"""GPU catalog (``data/gpus.yaml``): the cards the planner plans on, as
:class:`app.engine.gpu.GpuSpec` (the step-level engine's device model).

A card comes from the catalog by name (``"RTX 4090"``, or the NVML name
``"NVIDIA GeForce RTX 4090"``), from NVML (:func:`gpus_from_nvml`, through
:mod:`app.telemetry.nvml`), or — for a card the catalog does not know — from NVML's
memory alone with the other figures assumed (:func:`unknown_gpu`). Figures not checked
against a datasheet are listed in ``GpuSpec.assumed`` so the plan can mark them.

Which cards a plan is for (this machine's, a profile's fingerprint, a sim rig, the CPU
build) is chosen in one place: :func:`app.planner.cards.cards_for`.
"""
from __future__ import annotations

import functools
import re
from importlib import resources
from typing import Any

import yaml

from app.engine.gpu import GIB, GpuSpec
from app.telemetry.nvml import NvmlUnavailable, read_cards

__all__ = ["GIB", "GpuSpec", "UnknownGpuError"]  # GpuSpec and GIB are the engine's device model


class UnknownGpuError(KeyError):
    """A GPU name that is not in the catalog; the message lists close names and the fix.
    ``name``: the name as given."""

    def __init__(self, message: str, name: str | None = None) -> None:
        super().__init__(message)
        self.name = name

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])




def _norm(name: str) -> str:
    n = name.lower()
    for word in ("nvidia", "geforce", "tesla", "generation", "graphics"):
        n = n.replace(word, " ")
    return re.sub(r"[^a-z0-9]", "", n)


@functools.lru_cache(maxsize=1)
def load_catalog() -> dict[str, GpuSpec]:
    """All catalog cards by their catalog name (read once from package data)."""
    text = resources.files("app.planner").joinpath("data/gpus.yaml").read_text(encoding="utf-8")
    out: dict[str, GpuSpec] = {}
    for e in yaml.safe_load(text)["gpus"]:
        e = dict(e)
        e["nvml_names"] = tuple(e.get("nvml_names", ()))
        e["assumed"] = tuple(e.get("assumed", ()))
        out[e["name"]] = GpuSpec(**e)
    return out


def catalog_names() -> list[str]:
    return list(load_catalog())


def lookup_gpu(name: str, memory_gib: float | None = None) -> GpuSpec:
    """Catalog entry for a catalog or NVML name (case, spaces, "NVIDIA"/"GeForce"/"Tesla"
    ignored). ``memory_gib`` (NVML's total) picks between variants of one name and
    replaces the catalog figure. Raises :class:`UnknownGpuError` listing close names."""
    cat = load_catalog()
    key = _norm(name)
    hits = [g for g in cat.values() if key in {_norm(g.name), *(_norm(n) for n in g.nvml_names)}]
    if not hits:  # "RTX 5090 D", "H100 80GB HBM3e": a catalog name that the given name contains
        hits = [g for g in cat.values() if _norm(g.name) and _norm(g.name) in key]
        hits.sort(key=lambda g: -len(_norm(g.name)))
        hits = hits[:1]
    if not hits:
        close = [g.name for g in cat.values() if any(t in _norm(g.name) for t in re.findall(r"\d{3,}", key))]
        raise UnknownGpuError(
            f"GPU {name!r} is not in the catalog"
            + (f" (close: {', '.join(close)})" if close else "")
            + f"; use one of: {', '.join(cat)} — or give its memory so it plans as an unknown card",
            name,
        )
    if memory_gib is not None and len(hits) > 1:
        hits.sort(key=lambda g: abs(g.memory_gib - memory_gib))
    g = hits[0]
    return g.with_memory(memory_gib) if memory_gib is not None else g


def unknown_gpu(name: str, memory_gib: float, cc: float | None = None) -> GpuSpec:
    """A card the catalog does not know, planned from NVML's memory (GiB). Bandwidth,
    TFLOPS, P2P and the rest are assumed (a mid-range PCIe 4.0 consumer card: 900 GB/s,
    80 TFLOPS, no P2P) and listed in ``assumed``."""
    return GpuSpec(
        name=name, memory_gib=float(memory_gib), bandwidth_gbs=900.0, tflops_bf16=80.0,
        fp8=False, cc=cc if cc is not None else 8.0, pcie_gen=4, nvlink_gbs=0.0, p2p=False,
        tdp_w=0.0, assumed=("bandwidth_gbs", "tflops_bf16", "fp8", "pcie_gen", "nvlink_gbs", "p2p", "tdp_w")
        + (() if cc is not None else ("cc",)),
    )


def resolve_gpu(name: str, memory_gib: float | None = None, busy_gib: float = 0.0) -> GpuSpec:
    """Catalog card, or an unknown card when ``memory_gib`` is given; see :func:`lookup_gpu`."""
    try:
        g = lookup_gpu(name, memory_gib)
    except UnknownGpuError:
        if memory_gib is None:
            raise
        g = unknown_gpu(name, memory_gib)
    return g.with_memory(busy_gib=busy_gib)


def cpu_device(memory_gib: float, cores: int) -> GpuSpec:
    """The host CPU as a "device" for the CPU build of vLLM: ``memory_gib`` the memory it
    may use (GiB), ``cores`` the cores it runs on (this machine's: see
    :func:`app.planner.cards.host_cores`). Bandwidth ≈ 10 GB/s per core up to 4 cores and
    ≈ 0.05 TFLOPS per core are assumptions to calibrate (app.planner.calibrate)."""
    return GpuSpec(
        name="CPU", memory_gib=float(memory_gib), bandwidth_gbs=10.0 * max(1, min(cores, 4)),
        tflops_bf16=0.05 * max(1, cores), cc=0.0, pcie_gen=0, p2p=True, kind="cpu",
        assumed=("bandwidth_gbs", "tflops_bf16"),
    )


def gpus_from_hardware(hw: dict[str, Any]) -> list[GpuSpec]:
    """Cards from a case/profile ``hardware`` mapping: ``{gpu: NAME, count: N, busy_gib:
    [..]}`` or ``{gpus: [{gpu: NAME, memory_gib: X, busy_gib: Y}, ...]}``."""
    if "gpus" in hw:
        return [resolve_gpu(e["gpu"], e.get("memory_gib"), float(e.get("busy_gib", 0.0))) for e in hw["gpus"]]
    n = int(hw.get("count", 1))
    busy = hw.get("busy_gib") or []
    if isinstance(busy, (int, float)):
        busy = [busy] * n
    out = []
    for i in range(n):
        out.append(resolve_gpu(hw["gpu"], hw.get("memory_gib"), float(busy[i]) if i < len(busy) else 0.0))
    return out


def gpus_from_cards(info: Any) -> list[GpuSpec]:
    """Planner cards from NVML's readings (:class:`app.telemetry.nvml.CardsInfo`): the
    catalog entry for each name with NVML's total memory, and the memory in use (= other
    processes' share before a launch) as ``busy_gib``; a name the catalog does not know
    plans from its memory and compute capability (:func:`unknown_gpu`)."""
    out: list[GpuSpec] = []
    for c in info.cards:
        total, used = c.memory_total_bytes / GIB, c.memory_used_bytes / GIB
        try:
            g = lookup_gpu(c.name, total)
        except UnknownGpuError:
            cc = c.compute_capability
            g = unknown_gpu(c.name, total, None if cc is None else cc[0] + cc[1] / 10)
        out.append(g.with_memory(total, used))
    return out


def gpus_from_nvml(nvml: Any | None = None, indices: list[int] | None = None) -> list[GpuSpec]:
    """The cards present (``indices``: NVML indices, all when None), read through
    :func:`app.telemetry.nvml.read_cards` (``nvml``: ``pynvml`` or a double shaped like
    it) and made planner cards by :func:`gpus_from_cards`. Returns [] when NVML is not
    available (no library, no driver); raises ValueError for an index not present."""

    try:
        return gpus_from_cards(read_cards(indices, nvml))
    except NvmlUnavailable:
        return []
