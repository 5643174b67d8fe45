"""What a run runs on: the simulated rig's ``/sim/info`` (asked once per launch), its time
scale, and the hardware fingerprint stored with the run.

The fingerprint is the key of calibrations and the heading of comparisons
(:class:`app.profiles.model.HardwareFingerprint`): the sim's rig, this machine's cards
(NVML, through :mod:`app.telemetry.nvml`) or ``CPU`` for the CPU build of vLLM, or a
rig's hosts' cards from their agents (:func:`rig_hardware`); an attached server's cards
are unknown (None).
"""
from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any

from app.engines import Cards, Engine
from app.hosts.spec import Host, rig_link
from app.planner.cards import host_memory_gib
from app.profiles.model import HardwareFingerprint, SimRig
from app.server.supervisor import Supervisor
from app.telemetry.nvml import read_cards

log = logging.getLogger(__name__)


def sim_info(url: str, timeout: float = 3.0) -> dict[str, Any]:
    """What a simulated rig says about itself at ``URL/sim/info`` (``gpu``, ``gpu_count``,
    ``time_scale``, ``vllm_version`` …); ``{}`` for vLLM and any server without that
    endpoint (app.sim.http_api serves it)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/sim/info", timeout=timeout) as r:
            info = json.load(r)
            return info if isinstance(info, dict) else {}
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return {}


def time_scale_of(info: dict[str, Any]) -> float:
    """The time scale k in a ``/sim/info`` mapping: the sim runs k× faster than the wall
    clock; 1.0 when it names none or a bad one (vLLM, any other server)."""
    try:
        k = float(info.get("time_scale") or 1.0)
    except (TypeError, ValueError):
        return 1.0
    return k if k > 0 else 1.0


def sim_hardware(rig: SimRig | None, info: dict[str, Any] | None = None) -> HardwareFingerprint:
    """The fingerprint of a simulated rig: ``rig`` (a profile's ``SimRig`` with ``gpu``,
    ``count``, ``hosts``, ``link``) when given, else the rig its ``/sim/info`` mapping
    ``info`` names (``gpu``, ``gpu_count``, ``hosts``, ``link``; a run of ``vllm-dyno
    ramp`` has no profile)."""
    info = info or {}
    gpu = rig.gpu if rig is not None else str(info.get("gpu") or "RTX 4090")
    count = rig.count if rig is not None else int(info.get("gpu_count") or 1)
    hosts = rig.hosts if rig is not None else info.get("hosts")
    link = rig.link if rig is not None else info.get("link")
    ver = info.get("vllm_version", "")
    return HardwareFingerprint(gpu=gpu, count=count, vllm_version=f"sim {ver}".strip(), recorded_at=time.time(),
                               hosts=hosts if hosts and hosts > 1 else None, link=link if hosts and hosts > 1 else None)


def local_hardware(indices: list[int] | None, vllm_version: str | None, cpu_build: bool) -> HardwareFingerprint:
    """The fingerprint of this machine: NVML card names, count, memory (GiB, the smallest
    card's), compute capability (the lowest; None when NVML does not report every card's)
    and driver for the selected ``indices`` (all when None); ``CPU`` with the host
    memory for the CPU build of vLLM or when NVML is not available."""
    if not cpu_build:
        try:
            cards = read_cards(indices)
            if cards.names:
                uniq = list(dict.fromkeys(cards.names))
                ccs = [c.compute_capability for c in cards.cards]
                known = [c for c in ccs if c is not None]
                cc = None if len(known) < len(ccs) else min(a + b / 10 for a, b in known)
                return HardwareFingerprint(gpu=" + ".join(uniq), count=len(cards.names),
                                           memory_gib=round(min(cards.memory_gib), 2), compute_capability=cc,
                                           driver=cards.driver, vllm_version=vllm_version, recorded_at=time.time())
        except Exception as e:  # no driver / library: fall through to the CPU description
            log.debug("NVML not available for the fingerprint: %s", e)
    return HardwareFingerprint(gpu="CPU", count=1, memory_gib=round(host_memory_gib(), 1),
                               vllm_version=vllm_version, recorded_at=time.time())


def rig_hardware(engine: Engine | str, hosts: list[Host], hellos: list[dict[str, Any]], *,
                 info: dict[str, Any] | None = None, vllm_version: str | None = None) -> HardwareFingerprint:
    """The fingerprint of a rig of several hosts (issue 21), the same type as one
    machine's so that History, Compare, calibrate and the what-if read it alike: ``hosts``
    the rig's :class:`app.hosts.spec.Host` list, ``hellos`` each host's agent ``hello`` in
    the same order (app.hosts.agent.host_facts: NVML ``cards`` with ``name``,
    ``memory_total_bytes``, ``compute_capability``; the CPU build's ``cpu`` ``cores`` and
    ``memory_total_gib``). An engine of simulated cards (``sim``, ``Engine.spec.cards``): the
    simulated cards of the head's ``/sim/info`` (``info``) over the rig's hosts. Else
    (``vllm``) the real cards: each host's selected cards (its
    ``gpus``; all when None) — names joined by ``" + "`` where they differ, the smallest
    card's memory (GiB), the lowest compute capability — or one ``CPU`` per host without
    NVML cards (the smallest host memory, the fewest cores). ``hosts`` is the host count;
    ``link`` the slowest the hosts name (app.hosts.spec.rig_link; else the sim's)."""
    slowest = rig_link(hosts)
    link = slowest.name if slowest is not None else None
    n = len(hosts)
    if Engine(engine).spec.cards is Cards.SIM_RIG:
        hw = sim_hardware(None, info)
        return hw.model_copy(update={"hosts": n, "link": link or (info or {}).get("link")})
    names: list[str] = []
    mems: list[float] = []
    ccs: list = []
    cpu_cores: list[int] = []
    cpu_mem: list[float] = []
    for h, hello in zip(hosts, hellos):
        sel = h.gpu_indices()
        cards = [c for c in hello.get("cards") or [] if sel is None or c.get("index") in sel]
        if not cards:
            cpu = hello.get("cpu") or {}
            cpu_cores.append(int(cpu.get("cores") or 1))
            cpu_mem.append(float(cpu.get("memory_total_gib") or 0.0))
            continue
        for c in cards:
            names.append(str(c.get("name") or "GPU"))
            mems.append(float(c.get("memory_total_bytes") or 0) / 2**30)
            cc = c.get("compute_capability")
            ccs.append(cc[0] + cc[1] / 10 if cc else None)
    if not names:
        return HardwareFingerprint(gpu="CPU", count=n, memory_gib=round(min(cpu_mem), 1) if min(cpu_mem) > 0 else None,
                                   cores=min(cpu_cores), vllm_version=vllm_version, recorded_at=time.time(),
                                   hosts=n, link=link)
    mem = min(mems) if mems else 0.0
    return HardwareFingerprint(gpu=" + ".join(dict.fromkeys(names)), count=len(names) + len(cpu_cores),
                               memory_gib=round(mem, 2) if mem > 0 else None,
                               compute_capability=None if None in ccs else min(ccs), vllm_version=vllm_version,
                               recorded_at=time.time(), hosts=n, link=link)


def hardware_for(engine: Engine | str, *, rig: SimRig | None = None, supervisor: Supervisor | None = None,
                 info: dict[str, Any] | None = None, gpus: list[int] | None = None) -> HardwareFingerprint | None:
    """The fingerprint of a run, by the engine's cards (``Engine.spec.cards``): the rig for
    a simulated one, ``sim`` (``rig`` or the ``/sim/info`` mapping ``info``); this
    machine's cards (NVML) or ``CPU`` for the machine's, ``vllm`` (version and CPU build
    from the ``supervisor``'s interpreter and log; ``gpus``: the selected CUDA indices);
    None for unknown ones, ``attach`` (the cards behind a URL). Blocking (NVML): call it
    off the GUI thread."""
    cards = Engine(engine).spec.cards
    if cards is Cards.SIM_RIG:
        return sim_hardware(rig, info)
    if cards is Cards.MACHINE:
        version, cpu = None, False
        if supervisor is not None:
            if supervisor.interpreter is not None:
                version, cpu = supervisor.interpreter.version, supervisor.interpreter.is_cpu_build
            version = supervisor.parser.facts.version or version
            gpus = supervisor.config.gpus
        return local_hardware(gpus, version, cpu)
    return None
