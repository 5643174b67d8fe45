"""Virtual GPUs: NVML-like readings for the sim's ``GET /sim/telemetry``.

Per card, in rig time:
- memory used = the plan's reservation (weights + KV + activations + non-torch +
  CUDA graphs), fixed once loaded, as vLLM reserves it;
- utilization = busy fraction of the engine's steps over the last update interval — per
  data parallel replica: replica r's engine keeps its own cards r·TP·PP … busy;
- power = idle + (TDP − idle) · util · activity, times the clock factor;
- temperature: first-order model dT/dt = (T_ss − T)/τ with T_ss = ambient + P · R,
  R = cooling · (80 − 25) °C / TDP (a cooler sized to hold 80 °C at TDP in a 25 °C
  room when ``cooling`` = 1), τ = 45 s (assumed);
- above the slowdown temperature the SM clock drops 4 % per °C (floor 50 %), with NVML's
  "thermal (software)" clocks-event bit 0x20 set; idle sets bit 0x1.

Cooling presets (``--sim-cooling``, :data:`app.planner.gpus.COOLING`, where the rig's
options are checked): open 0.9, blower4 1.05 (4-card blower box), chassis8 1.12 (8-card
chassis), poor 1.35, or a number; the room's temperature ``--sim-ambient-c`` (°C). All
constants are assumptions for a plausible picture, not measurements.
"""
from __future__ import annotations

import math
import os
import random
import uuid

from app.planner.gpus import AMBIENT_RANGE_C, COOLING, cooling_text
from app.sim.model_adapter import Card, SimPlan
from app.telemetry.gpu_source import GpuInfo, GpuProcess, GpuReading, SessionInfo, SourceStatus, TelemetryDocument
from app.telemetry.throttle import decode

TAU_S = 45.0
ACTIVITY = 0.8  # share of TDP drawn at 100 % utilization by inference steps (assumed)
#: memory the driver reserves on each virtual card (NVML memory info v2 ``reserved``), bytes;
#: a typical few hundred MiB (assumed)
RESERVED_BYTES = 300 * 2**20
THERMAL_SW = 0x20
IDLE = 0x1


def cooling_factor(value: str | None, gpu_count: int) -> float:
    """``--sim-cooling`` → factor; default blower4 up to 4 cards, chassis8 above.
    Raises ValueError naming the option and the presets (:func:`app.planner.gpus.cooling_text`)."""
    if value is None:
        return COOLING["blower4" if gpu_count <= 4 else "chassis8"]
    try:
        text = cooling_text(value)
    except ValueError as e:
        raise ValueError(f"--sim-cooling {e}") from None
    return COOLING[text] if text in COOLING else float(text)


def ambient_c(value: float) -> float:
    """``--sim-ambient-c`` (°C) if within :data:`app.planner.gpus.AMBIENT_RANGE_C`, else ValueError naming it."""
    lo, hi = AMBIENT_RANGE_C
    if not lo <= value <= hi:
        raise ValueError(f"--sim-ambient-c {value:g}: give the room's temperature in °C, {lo:g} to {hi:g}")
    return value


class VirtualGpu:
    """One card's thermal and electrical state (temperatures °C, power W, clocks MHz)."""

    def __init__(self, index: int, spec: Card, r_th: float, ambient: float, uid: str) -> None:
        self.index, self.spec, self.r_th, self.ambient, self.uuid = index, spec, r_th, ambient, uid
        self.temp = ambient + spec.idle_w * r_th
        self.util = 0.0
        self.clock_factor = 1.0
        self.power = spec.idle_w

    def advance(self, dt: float, util: float) -> None:
        """Integrate ``dt`` rig seconds at utilization ``util`` (0–1)."""
        s = self.spec
        self.util = util
        over = self.temp - s.slowdown_c
        self.clock_factor = 1.0 if over <= 0 else max(0.5, 1.0 - 0.04 * over)
        self.power = s.idle_w + (s.tdp_w - s.idle_w) * util * ACTIVITY * self.clock_factor
        t_ss = self.ambient + self.power * self.r_th
        self.temp = t_ss + (self.temp - t_ss) * math.exp(-dt / TAU_S)
        over = self.temp - s.slowdown_c
        self.clock_factor = 1.0 if over <= 0 else max(0.5, 1.0 - 0.04 * over)

    @property
    def throttle_mask(self) -> int:
        m = THERMAL_SW if self.clock_factor < 1.0 else 0
        return m | (IDLE if self.util < 0.01 else 0)


class GpuBank:
    """The rig's cards; :meth:`busy` is called by each replica's engine for every step,
    :meth:`document` builds the telemetry JSON. ``seed`` varies each card's cooling
    by a few percent (the middle cards of a box run hotter). Replica r (of the plan's
    ``dp``) runs on cards r·TP·PP … (r+1)·TP·PP − 1, as vLLM places data parallel ranks."""

    UPDATE_S = 0.25

    def __init__(self, plan: SimPlan, count: int, cooling: float, seed: int = 0, ambient: float = 25.0,
                 t0: float = 0.0) -> None:
        rng = random.Random(seed)
        self.plan = plan
        spec = plan.card
        base_r = cooling * (80.0 - 25.0) / spec.tdp_w
        self.cards = []
        for i in range(count):
            middle = 1.0 + 0.05 * (1.0 - abs(2 * i - (count - 1)) / max(count - 1, 1))
            r = base_r * middle * (1.0 + rng.uniform(-0.03, 0.03))
            uid = "GPU-" + str(uuid.UUID(int=rng.getrandbits(128), version=4))
            self.cards.append(VirtualGpu(i, spec, r, ambient, uid))
        self.world = plan.tp * plan.pp
        self.replicas = plan.dp
        self.used_gpus = min(count, self.world * self.replicas)
        self.loaded = False
        self._t = t0
        self._busy = [0.0] * self.replicas

    def busy(self, t_end: float, dt: float, replica: int = 0) -> None:
        """Replica ``replica``'s engine was busy for ``dt`` rig s ending at ``t_end``."""
        self._busy[replica] += dt
        if t_end - self._t >= self.UPDATE_S:
            self.advance(t_end)

    def advance(self, t: float) -> None:
        """Integrate the thermal model up to rig time ``t``."""
        span = t - self._t
        if span <= 0:
            return
        for c in self.cards:
            r = c.index // self.world
            util = min(1.0, self._busy[r] / span) if c.index < self.used_gpus else 0.0
            c.advance(span, util)
        self._t, self._busy = t, [0.0] * self.replicas

    def slowdown_of(self, replica: int = 0) -> float:
        """Step-time multiplier (≥ 1) of one replica: the slowest of its cards sets the pace."""
        cards = self.cards[replica * self.world:min((replica + 1) * self.world, self.used_gpus)]
        return 1.0 / min(c.clock_factor for c in cards)

    @property
    def slowdown(self) -> float:
        """The slowest replica's step-time multiplier (≥ 1)."""
        return max(self.slowdown_of(r) for r in range(self.replicas))

    def readings(self) -> list[GpuReading]:
        p, s = self.plan, self.plan.card
        out = []
        for c in self.cards:
            used_by_server = self.loaded and c.index < self.used_gpus
            used = int(p.used_bytes_per_rank[c.index]) if used_by_server else 0
            mask = c.throttle_mask
            # as NVML memory info v2 reports it: the driver's reservation apart from used
            out.append(GpuReading(
                index=c.index, name=s.nvml_name, compute_capability=s.cc,
                uuid=c.uuid, pci_bus_id=f"00000000:{0x18 + 0x10 * c.index:02X}:00.0", mig_mode=False,
                memory_total_bytes=s.memory_bytes, memory_used_bytes=used, memory_reserved_bytes=RESERVED_BYTES,
                memory_free_bytes=s.memory_bytes - used - RESERVED_BYTES,
                util_gpu_pct=round(100 * c.util, 1), util_memory_pct=round(100 * c.util * 0.8, 1),
                temp_gpu_c=round(c.temp, 1), temp_slowdown_c=s.slowdown_c, temp_shutdown_c=s.shutdown_c,
                power_w=round(c.power, 1), power_limit_w=s.tdp_w,
                clock_sm_mhz=round(s.sm_clock_mhz * (c.clock_factor if c.util > 0.01 else 0.1)),
                clock_mem_mhz=s.mem_clock_mhz if c.util > 0.01 else 405.0,
                throttle_reasons=mask, throttle=decode(mask),
                fan_pct=round(min(100.0, max(30.0, 30 + (c.temp - 40) * 1.6)), 0),
                processes=[GpuProcess(pid=os.getpid(), used_memory_bytes=used, server=True)] if used_by_server else [],
            ))
        return out

    def session(self) -> SessionInfo:
        s = self.plan.card
        n = len(self.cards)
        link = "ok" if s.p2p or s.nvlink else "not_supported"
        return SessionInfo(
            driver_version="570.86.15 (sim)", cuda_version="12.8 (sim)",
            gpus=[GpuInfo(index=c.index, name=s.nvml_name, uuid=c.uuid, compute_capability=s.cc,
                          memory_total_bytes=s.memory_bytes, mig_mode=False) for c in self.cards],
            p2p=[[None if i == j else link for j in range(n)] for i in range(n)],
            topology=[[None if i == j else ("single" if s.nvlink else ("hostbridge" if n <= 4 else "system"))
                       for j in range(n)] for i in range(n)],
        )

    def document(self, t: float) -> TelemetryDocument:
        """The ``/sim/telemetry`` body at rig time ``t`` (integrates up to ``t`` first)."""
        self.advance(t)
        return TelemetryDocument(status=SourceStatus(), session=self.session(), readings=self.readings())
