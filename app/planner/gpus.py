"""GPU catalog (``data/gpus.yaml``): the cards the planner plans on, as
:class:`app.engine.gpu.GpuSpec` (the step-level engine's device model).

A card comes from the catalog by name (``"RTX 4090"``, or the NVML name
``"NVIDIA GeForce RTX 4090"``), from NVML (:func:`gpus_from_nvml`, through
:mod:`app.telemetry.nvml`), or — for a card the catalog does not know — from its memory
*and* compute capability (NVML's, or given as ``NAME:GIB:CC``) with the other figures
assumed (:func:`unknown_gpu`). The capability is never assumed: it decides which dtypes
and quantizations vLLM accepts, so an unknown card without one is an
:class:`UnknownGpuError` naming the fix. Figures not checked against a datasheet are
listed in ``GpuSpec.assumed`` so the plan can mark them.

The catalog file lists, per row, the datasheet figures, the names NVML reports and the
``source`` (keys of its ``sources`` table: a document name and URL each);
:func:`catalog_rows` gives the rows as written (tests check their consistency).

Which cards a plan is for (this machine's, a profile's fingerprint, a sim rig, the CPU
build) is chosen in one place: :func:`app.planner.cards.cards_for`.
"""
from __future__ import annotations

import functools
import re
from dataclasses import replace
from importlib import resources
from typing import Any

from app.engine.gpu import GIB, GpuSpec, LinkSpec, RigLayout
from app.fileio import load_yaml
from app.telemetry.nvml import NvmlUnavailable, read_cards

__all__ = ["GIB", "GpuSpec", "LinkSpec", "RigLayout", "UnknownGpuError", "UnknownLinkError"]  # GpuSpec, LinkSpec,
# RigLayout and GIB are the engine's device model


class UnknownGpuError(KeyError):
    """A GPU name that does not identify one catalog card; the message lists close names
    and the fix. ``name``: the name as given; ``candidates``: the catalog cards it could
    be when it names several variants (empty: not in the catalog)."""

    def __init__(self, message: str, name: str | None = None, candidates: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.name = name
        self.candidates = candidates

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])




#: the command that lists the catalog (named in errors instead of the whole list)
LIST_COMMAND = "vllm-dyno plan --list-gpus"

#: how to find a card's memory and compute capability (nvidia-smi's query fields)
_FIND_CC = "nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv"


def parse_cc(text: str | float) -> float:
    """A compute capability as NVML and ``nvidia-smi --query-gpu=compute_cap`` write it
    ("8.9") → 8.9. Raises ValueError naming the input and the form for anything else
    (major 1–20, one digit of minor)."""
    m = re.fullmatch(r"\s*(\d{1,2})\.(\d)\s*", str(text))
    if not m or not 1 <= int(m.group(1)) <= 20:
        raise ValueError(f"{text!r} is not a compute capability: write MAJOR.MINOR as nvidia-smi "
                         f"--query-gpu=compute_cap reports it, e.g. 8.9")
    return int(m.group(1)) + int(m.group(2)) / 10


_NOISE = ("nvidia", "geforce", "tesla", "generation", "graphics")

#: words of a name that make it another product than the catalog card it contains
#: ("RTX 5070 Ti Laptop GPU" is not the desktop RTX 5070 Ti): such a name plans as unknown
_OTHER_PRODUCT = {"laptop", "mobile", "notebook", "embedded"}


def _norm(name: str) -> str:
    n = name.lower()
    for word in _NOISE:
        n = n.replace(word, " ")
    return re.sub(r"[^a-z0-9]", "", n)


def _words(name: str) -> list[str]:
    """A name's words, lower case, without "NVIDIA"/"GeForce"/… ("NVIDIA GeForce RTX 5090 D"
    → ["rtx", "5090", "d"])."""
    return [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w and w not in _NOISE]


def _contains_words(name: list[str], part: list[str]) -> bool:
    return bool(part) and any(name[i:i + len(part)] == part for i in range(len(name) - len(part) + 1))


@functools.lru_cache(maxsize=1)
def catalog_rows() -> dict[str, Any]:
    """``data/gpus.yaml`` as written: ``{"sources": {key: reference}, "gpus": [row, …]}``
    (read once from package data)."""
    text = resources.files("app.planner").joinpath("data/gpus.yaml").read_text(encoding="utf-8")
    return load_yaml(text)


@functools.lru_cache(maxsize=1)
def load_catalog() -> dict[str, GpuSpec]:
    """All catalog cards by their catalog name."""
    out: dict[str, GpuSpec] = {}
    for e in catalog_rows()["gpus"]:
        e = {k: v for k, v in e.items() if k != "source"}
        e["nvml_names"] = tuple(e.get("nvml_names", ()))
        e["assumed"] = tuple(e.get("assumed", ()))
        out[e["name"]] = GpuSpec(**e)
    return out


@functools.lru_cache(maxsize=1)
def load_links() -> dict[str, LinkSpec]:
    """The inter-host links of the catalog (``links:`` of ``data/gpus.yaml``) by name."""
    out: dict[str, LinkSpec] = {}
    for e in catalog_rows()["links"]:
        out[e["name"]] = LinkSpec(e["name"], e["title"], float(e["line_gbps"]), float(e["bandwidth_gbs"]),
                                  float(e["latency_us"]))
    return out


class UnknownLinkError(KeyError):
    """A link name the catalog does not know; the message lists the names."""

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return str(self.args[0])


def lookup_link(name: str) -> LinkSpec:
    """The catalog link ``name`` (case and ``-``/``_``/space ignored: ``IB-HDR200``,
    ``ib_hdr200``). Raises :class:`UnknownLinkError` naming the catalog's links."""
    links = load_links()
    key = re.sub(r"[^a-z0-9]", "", str(name).lower())
    for k, v in links.items():
        if re.sub(r"[^a-z0-9]", "", k) == key:
            return v
    raise UnknownLinkError(f"link {name!r} is not in the link catalog: give one of {', '.join(links)} "
                           f"({LIST_COMMAND} lists them with their bandwidth and latency)")


def link_name(name: str | None) -> str | None:
    """The catalog's own name of link ``name`` (None stays None) — what a profile field
    stores. Raises ValueError naming the catalog's links (a pydantic validator's error)."""
    if name is None:
        return None
    try:
        return lookup_link(name).name
    except UnknownLinkError as e:
        raise ValueError(str(e)) from None


#: the simulated rig's cooling presets (``--sim-cooling``, a profile's ``sim: {cooling}``): each
#: card's thermal resistance as a factor of a cooler that holds 80 °C at TDP in a 25 °C room
#: (app.sim.gpus); open 0.9, blower4 1.05 (4-card blower box), chassis8 1.12 (8-card
#: chassis), poor 1.35 — assumptions for a plausible picture, not measurements
COOLING = {"open": 0.9, "blower4": 1.05, "chassis8": 1.12, "poor": 1.35}
#: the cooling factors a rig may be given instead of a preset (lowest, highest)
COOLING_RANGE = (0.2, 5.0)
#: the sim rig's room temperatures (``--sim-ambient-c``), °C (lowest, highest), and its default
AMBIENT_RANGE_C = (0.0, 60.0)
DEFAULT_AMBIENT_C = 25.0


def cooling_text(value: str | float) -> str:
    """A rig's cooling as a profile and the sim server's ``--sim-cooling`` keep it: a
    preset's name (:data:`COOLING`) or a factor in :data:`COOLING_RANGE` (1 = holds 80 °C
    at TDP; 2 = twice as hot above the room). Raises ValueError naming the presets."""
    text = str(value).strip()
    if text.lower() in COOLING:
        return text.lower()
    try:
        f = float(text)
    except ValueError:
        raise ValueError(f"{text!r}: give a cooling preset ({', '.join(COOLING)}) or a factor such as 1.1 "
                         "(1 = holds 80 °C at TDP)") from None
    lo, hi = COOLING_RANGE
    if not lo <= f <= hi:  # NaN fails too
        raise ValueError(f"{text}: give a cooling factor between {lo:g} and {hi:g} (1 = holds 80 °C at TDP), "
                         f"or a preset ({', '.join(COOLING)})")
    return f"{f:g}"


def rig_layout(hosts: int, cards_per_host: int, link: str | LinkSpec | None) -> RigLayout:
    """The layout ``hosts`` × ``cards_per_host`` joined by ``link`` (a catalog name or a
    LinkSpec). Raises ValueError for a count below 1, :class:`UnknownLinkError` for an
    unknown name, and ValueError for several hosts without a link (the model needs it)."""
    if hosts < 1 or cards_per_host < 1:
        raise ValueError(f"a rig of {hosts} host(s) × {cards_per_host} card(s): give at least one of each")
    spec = lookup_link(link) if isinstance(link, str) else link
    if hosts > 1 and spec is None:
        raise ValueError(f"a rig of {hosts} hosts needs the link between them: one of {', '.join(load_links())}")
    return RigLayout(hosts, cards_per_host, spec)


def catalog_names() -> list[str]:
    return list(load_catalog())


def lookup_gpu(name: str, memory_gib: float | None = None) -> GpuSpec:
    """Catalog entry for a catalog or NVML name (case, spaces, "NVIDIA"/"GeForce"/"Tesla"
    ignored). ``memory_gib`` (NVML's total) picks between variants of one name and
    replaces the catalog figure. Raises :class:`UnknownGpuError` listing close names."""
    cat = load_catalog()
    key = _norm(name)
    hits = [g for g in cat.values() if key in {_norm(g.name), *(_norm(n) for n in g.nvml_names)}]
    if memory_gib is None and len(hits) > 1:  # "RTX 3060" is the catalog name of one of its variants
        hits = [g for g in hits if _norm(g.name) == key] or hits
    words = _words(name)
    if not hits and not _OTHER_PRODUCT & set(words):
        # a board variant NVML names with more words ("NVIDIA RTX A6000 (Dell)"): the longest catalog name
        # whose words it contains as whole words — "RTX A400" does not contain "A40"
        hits = [g for g in cat.values() if _contains_words(words, _words(g.name))]
        hits.sort(key=lambda g: (-len(_words(g.name)), -len(g.name)))
        hits = hits[:1]
    if not hits:
        close = [g.name for g in cat.values() if any(t in _norm(g.name) for t in re.findall(r"\d{3,}", key))]
        raise UnknownGpuError(
            f"GPU {name!r} is not in the catalog"
            + (f" (close: {', '.join(close)})" if close else "")
            + f" ({LIST_COMMAND} lists the catalog); to plan a card it does not know, give its memory and "
            f"compute capability as NAME:GIB:CC, e.g. \"{name}:24:8.9\" ({_FIND_CC})",
            name,
        )
    if len(hits) > 1:  # variants of one NVML name ("NVIDIA GeForce RTX 4060 Ti": 8 or 16 GB)
        if memory_gib is None:
            raise UnknownGpuError(
                f"GPU {name!r} is one of {', '.join(g.name for g in hits)}: give the catalog name or the memory, "
                f"e.g. \"{name}:{hits[-1].memory_gib:g}\"", name, tuple(g.name for g in hits))
        hits.sort(key=lambda g: abs(g.memory_gib - memory_gib))
    g = hits[0]
    return g.with_memory(memory_gib) if memory_gib is not None else g


def unknown_gpu(name: str, memory_gib: float, cc: float) -> GpuSpec:
    """A card the catalog does not know, planned from its memory (GiB, NVML's total) and
    compute capability ``cc`` (NVML's ``nvmlDeviceGetCudaComputeCapability``, or the
    user's). FP8 tensor cores follow from the capability (from 8.9: Ada, Hopper,
    Blackwell); bandwidth, TFLOPS, P2P and the rest are assumed (a mid-range PCIe 4.0
    consumer card: 900 GB/s, 80 TFLOPS, no P2P) and listed in ``assumed``."""
    return GpuSpec(
        name=name, memory_gib=float(memory_gib), bandwidth_gbs=900.0, tflops_bf16=80.0,
        fp8=cc >= 8.9, cc=float(cc), pcie_gen=4, nvlink_gbs=0.0, p2p=False, tdp_w=0.0,
        assumed=("bandwidth_gbs", "tflops_bf16", "pcie_gen", "nvlink_gbs", "p2p", "tdp_w"),
    )


def resolve_gpu(name: str, memory_gib: float | None = None, busy_gib: float = 0.0,
                cc: float | None = None) -> GpuSpec:
    """Catalog card (see :func:`lookup_gpu`; ``cc``, when given, must agree with the
    catalog's), or an unknown card when both ``memory_gib`` (GiB) and ``cc`` (compute
    capability) are given. Raises :class:`UnknownGpuError` for an unknown name without
    them — naming what is missing and the ``NAME:GIB:CC`` form — and ValueError for a
    ``cc`` the catalog contradicts."""
    try:
        g = lookup_gpu(name, memory_gib)
    except UnknownGpuError as e:
        if memory_gib is None or e.candidates:
            raise
        if cc is None:
            raise missing_cc_error(name, memory_gib, f"the memory, {memory_gib:g} GiB, is given but not the "
                                   f"capability") from None
        return unknown_gpu(name, memory_gib, cc).with_memory(busy_gib=busy_gib)
    if cc is not None and abs(g.cc - cc) > 1e-6:
        raise ValueError(f"{name!r}: compute capability {cc:.1f} was given, but the catalog's {g.name} has "
                         f"{g.cc:.1f}; give the card's own name (e.g. from {_FIND_CC}), or leave the "
                         f"capability out for a catalog card")
    return g.with_memory(busy_gib=busy_gib)


def missing_cc_error(name: str, memory_gib: float, where: str) -> UnknownGpuError:
    """The error for a card the catalog does not know and whose compute capability is
    not known (``where``: the source that did not report it, e.g. "NVML did not report
    it for GPU 1 (not supported)")."""
    return UnknownGpuError(
        f"GPU {name!r} is not in the catalog and its compute capability is not known ({where}); the plan's "
        f"dtype and quantization checks need it: give the card as NAME:GIB:CC, e.g. "
        f"\"{name}:{memory_gib:g}:8.9\" with the capability from {_FIND_CC}", name)


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
    [..]}`` or ``{gpus: [{gpu: NAME, memory_gib: X, cc: 8.9, busy_gib: Y}, ...]}`` (``cc``
    only for a card the catalog does not know)."""
    if "gpus" in hw:
        return [resolve_gpu(e["gpu"], e.get("memory_gib"), float(e.get("busy_gib", 0.0)),
                            None if e.get("cc") is None else parse_cc(e["cc"])) for e in hw["gpus"]]
    n = int(hw.get("count", 1))
    busy = hw.get("busy_gib") or []
    if isinstance(busy, (int, float)):
        busy = [busy] * n
    cc = None if hw.get("cc") is None else parse_cc(hw["cc"])
    out = []
    for i in range(n):
        out.append(resolve_gpu(hw["gpu"], hw.get("memory_gib"), float(busy[i]) if i < len(busy) else 0.0, cc))
    return out


def nvml_card(name: str, total_bytes: int, busy_bytes: int, cc: tuple[int, int] | None, index: int,
              why_no_cc: str | None = None) -> GpuSpec:
    """One planner card from what NVML reports of it: the catalog entry for ``name``
    (NVML's compute capability, when reported, wins over the catalog's) or — for a name
    the catalog does not know — :func:`unknown_gpu` from NVML's memory and capability;
    ``busy_bytes`` (total − free: other processes' allocations plus driver-reserved
    memory) becomes ``busy_gib`` — vLLM checks its request against the free memory
    cudaMemGetInfo reports (vllm/utils/mem_utils.py ``MemorySnapshot.measure``, 0.32),
    which the reservation is not part of. Raises :class:`UnknownGpuError` for an unknown card
    whose capability NVML did not report (``why_no_cc``: its reason)."""
    total, busy = total_bytes / GIB, busy_bytes / GIB
    nvml_cc = None if cc is None else cc[0] + cc[1] / 10
    try:
        g = lookup_gpu(name, total)
    except UnknownGpuError as e:
        if e.candidates:
            raise
        if nvml_cc is None:
            raise missing_cc_error(name, total, f"NVML did not report it for GPU {index}"
                                   + (f": {why_no_cc}" if why_no_cc else "")) from None
        g = unknown_gpu(name, total, nvml_cc)
    if nvml_cc is not None and abs(g.cc - nvml_cc) > 1e-6:
        g = replace(g, cc=nvml_cc)
    return g.with_memory(total, busy)


def gpus_from_cards(info: Any) -> list[GpuSpec]:
    """Planner cards from NVML's readings (:class:`app.telemetry.nvml.CardsInfo`), one
    :func:`nvml_card` each."""
    return [nvml_card(c.name, c.memory_total_bytes, c.busy_bytes, c.compute_capability, c.index) for c in info.cards]


def gpus_from_nvml(nvml: Any | None = None, indices: list[int] | None = None) -> list[GpuSpec]:
    """The cards present (``indices``: NVML indices, all when None), read through
    :func:`app.telemetry.nvml.read_cards` (``nvml``: ``pynvml`` or a double shaped like
    it) and made planner cards by :func:`gpus_from_cards`. Returns [] when NVML is not
    available (no library, no driver); raises ValueError for an index not present."""

    try:
        return gpus_from_cards(read_cards(indices, nvml))
    except NvmlUnavailable:
        return []
