"""The one place that chooses the cards a plan is for: :func:`cards_for`.

The GUI's live plan (widgets/plan_panel.py), ``vllm-dyno plan`` (app/cli/plan.py)
and a headless run (:meth:`app.profiles.model.HardwareFingerprint.planner_cards`) all
call it; nothing else builds the planner's card list or guesses the host's cores.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import psutil

from app.engines import SELECTABLE, Cards, Engine, names
from app.planner.gpus import GIB, GpuSpec, cpu_device, gpus_from_cards, nvml_card, parse_cc, resolve_gpu
from app.telemetry.nvml import NvmlUnavailable, read_cards

#: the first NUMA node's memory (Linux sysfs); the CPU build of vLLM plans on one node
NODE0_MEMINFO = Path("/sys/devices/system/node/node0/meminfo")
#: the NUMA nodes (Linux sysfs): ``nodeN/meminfo``, ``nodeN/cpulist``
NODE_DIR = Path("/sys/devices/system/node")
#: the cgroup memory limit files vLLM reads (v2 unified, then v1)
CGROUP_DIR = Path("/sys/fs/cgroup")

_MEMINFO_RE = re.compile(r"^Node\s+\d+\s+([\w()]+):\s+(\d+)", re.MULTILINE)


class NoGpuFound(LookupError):
    """No card to plan for: NVML sees none (or is not available, with its reason), or
    none of the selected indices is among the readings."""


@dataclass(frozen=True)
class NodeMemory:
    """The memory of the NUMA node the CPU build of vLLM runs on, as vLLM reads it, GiB
    (2**30 bytes): ``total_gib`` MemTotal, ``available_gib`` what vLLM counts as
    available (see :func:`node_memory`); ``node`` its number; ``source`` where the
    figures came from (a sysfs file, or ``psutil`` without one)."""

    node: int
    total_gib: float
    available_gib: float
    source: str

    @property
    def busy_gib(self) -> float:
        """Memory of the node held by others (total − available), GiB."""
        return max(0.0, self.total_gib - self.available_gib)


def host_cores() -> int:
    """The CPU cores this process may run on (and so the server it launches):
    ``len(os.sched_getaffinity(0))`` where the OS has it (Linux — respects taskset and
    cgroup cpusets), else ``psutil.cpu_count(logical=True)``; at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, psutil.cpu_count(logical=True) or 1)


def _cpulist(text: str) -> set[int]:
    """``0-3,8,10-11`` → {0, 1, 2, 3, 8, 10, 11}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        a, _, b = part.partition("-")
        if a.strip().isdigit():
            out.update(range(int(a), int(b) + 1 if b.strip().isdigit() else int(a) + 1))
    return out


def vllm_node() -> int:
    """The NUMA node whose memory the CPU build of vLLM checks: the node of the first CPU
    this process may run on (vllm/v1/worker/cpu_worker.py: ``get_allowed_cpu_list()[0]
    .numa_node``, vLLM 0.32), from sysfs ``nodeN/cpulist``; 0 when not known."""
    try:
        first = min(os.sched_getaffinity(0))
        for d in sorted(NODE_DIR.glob("node[0-9]*")):
            if first in _cpulist((d / "cpulist").read_text()):
                return int(d.name[4:])
    except (AttributeError, OSError, ValueError):
        pass
    return 0


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None  # absent, or "max" (no limit)


def _cgroup_limit_usage() -> tuple[int | None, int | None]:
    """(limit, usage) in bytes of this process's memory cgroup as vLLM reads them
    (vllm/utils/cpu_resource_utils.py, get_cgroup_memory_limit/usage, vLLM 0.32): v2
    ``memory.max``/``memory.current``, else v1 ``memory.limit_in_bytes`` (≥ 2**62: no
    limit)/``memory.usage_in_bytes``; (None, None) without a limit."""
    v2 = _read_int(CGROUP_DIR / "memory.max")
    if v2 is not None:
        return v2, _read_int(CGROUP_DIR / "memory.current")
    v1 = _read_int(CGROUP_DIR / "memory" / "memory.limit_in_bytes")
    if v1 is not None and v1 < (1 << 62):
        return v1, _read_int(CGROUP_DIR / "memory" / "memory.usage_in_bytes")
    return None, None


def node_memory(node_meminfo: Path | None = None) -> NodeMemory:
    """The node memory the CPU build of vLLM compares ``gpu_memory_utilization`` with,
    read the way vLLM reads it (vllm/utils/cpu_resource_utils.py, get_memory_node_info,
    vLLM 0.32): from ``node_meminfo`` (default: :func:`vllm_node`'s sysfs ``meminfo``,
    lines ``Node N Key: V kB``), total = ``MemTotal``, available = ``MemFree`` +
    ``Active(file)`` + ``Inactive(file)`` + ``SReclaimable`` (kB × 1024 → bytes); under a
    cgroup memory limit below the total, total = the limit and available = min(available,
    limit − usage) (0.32.0 does so; not every version clamps, but the limit holds the
    server either way). Without the file (no NUMA sysfs): psutil's total and available."""
    node = vllm_node()
    path = node_meminfo if node_meminfo is not None else (NODE0_MEMINFO if node == 0 else
                                                          NODE_DIR / f"node{node}" / "meminfo")
    try:
        kv = {k: int(v) * 1024 for k, v in _MEMINFO_RE.findall(path.read_text())}
    except OSError:
        kv = {}
    if "MemTotal" in kv:
        total = kv["MemTotal"]
        avail = sum(kv.get(k, 0) for k in ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable"))
        source = str(path)
    else:
        vm = psutil.virtual_memory()
        total, avail, source = vm.total, vm.available, "psutil"
    limit, usage = _cgroup_limit_usage()
    if limit is not None and limit < total:
        total = limit
        avail = max(0, min(avail, limit - (usage or 0)))
    return NodeMemory(node, total / GIB, avail / GIB, source)


def host_memory_gib(node_meminfo: Path | None = None) -> float:
    """The memory the CPU build of vLLM may plan on, GiB (2**30 bytes): the total of
    :func:`node_memory` — the CPU build binds each worker to one NUMA node and allocates
    there, so a device is one node (``node_meminfo``, default the node's sysfs file,
    ``Node 0 MemTotal: N kB``; the host total from psutil without one)."""
    return node_memory(node_meminfo).total_gib


def _is_cpu(name: str) -> bool:
    return name.strip().upper() == "CPU"


def _parse_entry(entry: str, memory_gib: float | None,
                 cc: float | None) -> tuple[str, float | None, float | None]:
    """``NAME``, ``NAME:GIB`` or ``NAME:GIB:CC`` → (name, memory GiB or ``memory_gib``,
    compute capability or ``cc``)."""
    name, *rest = entry.split(":")
    name = name.strip()
    if not name or len(rest) > 2:
        raise ValueError(f"{entry!r}: give a card name, e.g. \"RTX 4090\", or NAME:GIB:CC for a card the catalog "
                         f"does not know, e.g. \"RTX 4090:24:8.9\"")
    if not rest:
        return name, memory_gib, cc
    gib = rest[0]
    try:
        mem = float(gib)
    except ValueError:
        raise ValueError(f"{entry!r}: {gib!r} is not a memory size in GiB; write NAME:GIB:CC, "
                         f"e.g. \"{name}:24:8.9\"") from None
    if not mem > 0:
        raise ValueError(f"{entry!r}: the memory must be more than 0 GiB, e.g. \"{name}:24:8.9\"")
    if len(rest) == 2:
        try:
            cc = parse_cc(rest[1])
        except ValueError as e:
            raise ValueError(f"{entry!r}: {e}, as in \"{name}:{mem:g}:8.9\"") from None
    return name, mem, cc


def _cpu_cards(count: int | None, memory_gib: float | None, busy_gib: float = 0.0) -> list[GpuSpec]:
    """The CPU build's devices: ``memory_gib`` (and ``busy_gib`` held by others) when
    given, else this machine's node as vLLM reads it (:func:`node_memory`: its total, and
    total − available as the memory others hold)."""
    if memory_gib is None:
        nm = node_memory()
        memory_gib, busy_gib = nm.total_gib, nm.busy_gib
    return [cpu_device(memory_gib, host_cores()).with_memory(busy_gib=busy_gib)] * max(1, count or 1)


def _named_cards(gpu: str | Sequence[str], count: int | None, memory_gib: float | None,
                 busy_gib: float, cc: float | None = None) -> list[GpuSpec]:
    entries = gpu.split(" + ") if isinstance(gpu, str) else list(gpu)
    entries = [str(e).strip() for e in entries if str(e).strip()]
    if not entries:
        raise ValueError("no card name given: name one, e.g. \"RTX 4090\" (or \"CPU\" for the CPU build)")
    parsed = [_parse_entry(e, memory_gib, cc) for e in entries]
    if any(_is_cpu(n) for n, _, _ in parsed):
        if len(parsed) > 1:
            raise ValueError(f"{' + '.join(entries)}: the CPU build cannot be mixed with GPUs; plan one or the other")
        return _cpu_cards(count, parsed[0][1], busy_gib)
    cards = [resolve_gpu(n, mem, busy_gib, c) for n, mem, c in parsed]
    n = len(cards) if count is None else count
    if n < 1:
        raise ValueError(f"count={count}: plan at least one card")
    return [cards[i % len(cards)] for i in range(n)]


def _reading_card(r: Any) -> GpuSpec:
    """One reading (``GpuReading``) as a planner card: NVML's memory — total, and total −
    free as memory other processes and the driver hold — and NVML's compute capability
    (:func:`app.planner.gpus.nvml_card`); a catalog card by name alone when the reading
    has no memory."""
    if not r.memory_total_bytes:
        return resolve_gpu(r.name or "GPU")
    busy = r.busy_bytes if r.busy_bytes is not None else (r.memory_used_bytes or 0)
    return nvml_card(r.name or "GPU", r.memory_total_bytes, busy, r.compute_capability, r.index,
                     r.unavailable.get("compute_capability"))


def _reading_cards(readings: Sequence[Any], indices: Sequence[int] | None) -> list[GpuSpec]:
    sel = None if indices is None else {int(i) for i in indices}
    out = [_reading_card(r) for r in readings if sel is None or r.index in sel]
    if not out:
        have = sorted(r.index for r in readings)
        raise NoGpuFound(f"none of the selected GPUs {sorted(sel or [])} is on this machine (it has {have})"
                         if readings else "no GPU found through NVML")
    return out


def _nvml_cards(indices: Sequence[int] | None, nvml: Any) -> list[GpuSpec]:
    try:
        info = read_cards(indices, nvml)
    except NvmlUnavailable as e:
        raise NoGpuFound(f"no GPU found through NVML: {e.message}") from e
    cards = gpus_from_cards(info)
    if not cards:
        raise NoGpuFound("no GPU found through NVML")
    return cards


def cards_for(*, engine: Engine | str = Engine.VLLM, gpu: str | Sequence[str] | None = None, count: int | None = None,
              memory_gib: float | None = None, busy_gib: float = 0.0, indices: Sequence[int] | None = None,
              readings: Sequence[Any] | None = None, cpu_build: bool = False, nvml: Any = None,
              cc: float | None = None) -> list[GpuSpec]:
    """The cards the planner plans for (one :class:`GpuSpec` per rank's card), from
    exactly one source:

    - **a sim rig** — ``engine="sim"``: ``gpu`` (catalog name) × ``count`` (default 1);
      readings, NVML and ``cpu_build`` are not looked at.
    - **the CPU build of vLLM** — ``cpu_build=True`` or ``gpu="CPU"``: ``count`` (default
      1; one per NUMA node a tensor-parallel run spans) devices with this machine's real
      core count (:func:`host_cores`) and ``memory_gib`` or else one NUMA node's memory as
      vLLM reads it (:func:`node_memory`: the node's ``MemTotal`` from sysfs when present,
      else the psutil total; what is not available there counts as held by others).
    - **named cards** — a fingerprint-like description: ``gpu`` a name (catalog or NVML
      name; mixed rigs joined by ``" + "``) or a list of names, one per card; each may be
      ``NAME:GIB`` (memory of that card, GiB) or ``NAME:GIB:CC`` (and its compute
      capability), else ``memory_gib`` and ``cc`` apply (NVML's total and capability). A
      name the catalog does not know plans only with both memory and capability —
      never an assumed capability. ``count`` cards, the names taken in turn (default
      one card per name); ``busy_gib`` GiB held by other processes on each.
    - **NVML readings already taken** — ``readings`` (``GpuReading``: ``index``, ``name``,
      memory, ``compute_capability``) of the cards in ``indices`` (all when None); memory
      that is not free (other processes' and the driver's) counts as held.
    - **this machine through NVML** — none of the above: :func:`app.telemetry.nvml.read_cards`
      for ``indices`` (all when None); ``nvml`` a pynvml-shaped double in tests.

    ``engine`` (an :class:`app.engines.Engine` or its name) says which: its ``spec.cards``
    — the simulated rig's (``sim``) or the machine's (``vllm``, the default); ``attach`` is
    refused (an attached server's cards are not known), and so is an engine that is not
    selectable (``ray``: a host's part of a launch, planned as that launch). Raises
    ValueError for conflicting sources or bad input, ``app.planner.gpus.UnknownGpuError``
    for a name the catalog does not know without memory and compute capability,
    :class:`NoGpuFound` when NVML (or the readings) give no card.
    """
    planned = tuple(e for e in SELECTABLE if e.planned)
    eng = Engine.parse(engine)
    if eng is not None and eng.spec.cards is Cards.UNKNOWN:
        raise ValueError("an attached server is not planned: its cards are not known")
    if eng not in planned:
        raise ValueError(f"engine {getattr(engine, 'value', engine)!r}: plan for {names(planned)}")
    assert eng is not None
    if count is not None and count < 1:
        raise ValueError(f"count={count}: plan at least one card")
    if eng.spec.cards is Cards.SIM_RIG:
        if not gpu:
            raise ValueError("a sim rig needs its GPU name, e.g. gpu=\"RTX 4090\"")
        return _named_cards(gpu, count, memory_gib, busy_gib, cc)
    named_cpu = isinstance(gpu, str) and _is_cpu(gpu)
    given = [k for k, v in (("gpu", gpu is not None and not (cpu_build and named_cpu)),
                            ("readings", readings is not None), ("cpu_build", cpu_build)) if v]
    if len(given) > 1:
        raise ValueError(f"plan for one source of cards, not {' and '.join(given)}")
    if cpu_build:
        return _cpu_cards(count, memory_gib)
    if gpu is not None:
        return _named_cards(gpu, count, memory_gib, busy_gib, cc)
    if readings is not None:
        return _reading_cards(readings, indices)
    return _nvml_cards(indices, nvml)
