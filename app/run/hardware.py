"""What a run runs on: the simulated rig's ``/sim/info`` (asked once per launch), its time
scale, and the hardware fingerprint stored with the run.

The fingerprint is the key of calibrations and the heading of comparisons
(:class:`app.profiles.model.HardwareFingerprint`): the sim's rig, this machine's cards
(NVML, through :mod:`app.telemetry.nvml`) or ``CPU`` for the CPU build of vLLM; an
attached server's cards are unknown (None).
"""
from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from typing import Any

from app.planner.cards import host_memory_gib
from app.profiles.model import HardwareFingerprint
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


def sim_hardware(rig: Any, info: dict[str, Any] | None = None) -> HardwareFingerprint:
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
                cc = None if None in ccs else min(a + b / 10 for a, b in ccs)
                return HardwareFingerprint(gpu=" + ".join(uniq), count=len(cards.names),
                                           memory_gib=round(min(cards.memory_gib), 2), compute_capability=cc,
                                           driver=cards.driver, vllm_version=vllm_version, recorded_at=time.time())
        except Exception as e:  # no driver / library: fall through to the CPU description
            log.debug("NVML not available for the fingerprint: %s", e)
    return HardwareFingerprint(gpu="CPU", count=1, memory_gib=round(host_memory_gib(), 1),
                               vllm_version=vllm_version, recorded_at=time.time())


def hardware_for(engine: str, *, rig: Any = None, supervisor=None, info: dict[str, Any] | None = None,
                 gpus: list[int] | None = None) -> HardwareFingerprint | None:
    """The fingerprint of a run: the rig for engine ``sim`` (``rig`` or the ``/sim/info``
    mapping ``info``), this machine's cards (NVML) or ``CPU`` for engine ``vllm`` (version
    and CPU build from the ``supervisor``'s interpreter and log; ``gpus``: the selected
    CUDA indices), None for ``attach`` (the cards behind a URL are unknown). Blocking
    (NVML): call it off the GUI thread."""
    if engine == "sim":
        return sim_hardware(rig, info)
    if engine == "vllm":
        version, cpu = None, False
        if supervisor is not None:
            if supervisor.interpreter is not None:
                version, cpu = supervisor.interpreter.version, supervisor.interpreter.is_cpu_build
            version = supervisor.parser.facts.version or version
            gpus = supervisor.config.gpus
        return local_hardware(gpus, version, cpu)
    return None
