"""The GPU source interface and the JSON shape of a GPU reading.

A GPU source answers three questions: can I read GPUs at all (:class:`SourceStatus`),
what is fixed for the session (:class:`SessionInfo`: driver and CUDA versions, each
card's identity and compute capability, P2P status and topology between the selected
cards), and what do the cards say now (a list of :class:`GpuReading`, one per card).

Implementations: :class:`app.telemetry.nvml_source.NvmlSource` (``pynvml``) and
:class:`app.telemetry.http_source.HttpGpuSource`, which reads the same shape as JSON
from a simulated rig's ``GET /sim/telemetry`` (see :class:`TelemetryDocument`).

Units: bytes, %, °C, W, MHz, bytes/s. ``None`` = "not available" (the card or the
driver did not give the field; :attr:`GpuReading.unavailable` says why) — never 0.
"""
from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

SCHEMA = "vllm-dyno.gpu-telemetry/1"

#: source states: ok; no_driver (no library / driver not loaded); driver_mismatch
#: (library and kernel module differ); no_gpu (driver fine, zero cards); error (other)
SourceState = Literal["ok", "no_driver", "driver_mismatch", "no_gpu", "no_permission", "error", "closed"]


class SourceStatus(BaseModel):
    """Whether a source can deliver readings; ``message`` is for the user, no traceback."""

    state: SourceState = "ok"
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.state == "ok"


class GpuProcess(BaseModel):
    """A compute process on a card. ``used_memory_bytes`` None = not reported (e.g. in containers)."""

    pid: int
    used_memory_bytes: int | None = None
    server: bool = False  # belongs to the supervised server's process group


class GpuReading(BaseModel):
    """What one card says at one moment. Every measured field may be None (not available).

    ``index``: NVML index (or the rig's index). ``state``: ``ok`` or ``lost`` (fell off the
    bus: every field None). ``throttle_reasons``: NVML clocks-event bitmask;
    ``throttle``: its decoded names (see :mod:`app.telemetry.throttle`).
    """

    model_config = ConfigDict(extra="ignore")

    index: int
    state: Literal["ok", "lost"] = "ok"
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    mig_mode: bool | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    util_gpu_pct: float | None = None
    util_memory_pct: float | None = None
    temp_gpu_c: float | None = None
    temp_memory_c: float | None = None
    temp_slowdown_c: float | None = None
    temp_shutdown_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    clock_sm_mhz: float | None = None
    clock_mem_mhz: float | None = None
    throttle_reasons: int | None = None
    throttle: list[str] | None = None
    pcie_tx_bytes_per_s: float | None = None
    pcie_rx_bytes_per_s: float | None = None
    fan_pct: float | None = None
    processes: list[GpuProcess] | None = None
    #: field name → why it is None ("not supported", "GPU is lost", …)
    unavailable: dict[str, str] = Field(default_factory=dict)

    @property
    def vram_headroom_bytes(self) -> int | None:
        """Total − used memory (bytes), None when either is not available."""
        if self.memory_total_bytes is None or self.memory_used_bytes is None:
            return None
        return self.memory_total_bytes - self.memory_used_bytes


#: numeric reading fields that become time series (sample name = field name)
SERIES_FIELDS: tuple[str, ...] = (
    "memory_total_bytes", "memory_used_bytes", "memory_free_bytes", "util_gpu_pct", "util_memory_pct",
    "temp_gpu_c", "temp_memory_c", "temp_slowdown_c", "temp_shutdown_c", "power_w", "power_limit_w",
    "clock_sm_mhz", "clock_mem_mhz", "throttle_reasons", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s", "fan_pct",
)


class GpuInfo(BaseModel):
    """Per-card facts read once per session."""

    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    compute_capability: tuple[int, int] | None = None
    memory_total_bytes: int | None = None
    mig_mode: bool | None = None


class SessionInfo(BaseModel):
    """Facts read once per session.

    ``p2p[i][j]``: P2P read status between selected cards i and j by position in ``gpus``
    (``"ok"``, ``"not_supported"``, ``"chipset_not_supported"``, …; None on the diagonal
    or when not available). ``topology[i][j]``: common ancestor level (``"internal"``,
    ``"single"``, ``"multiple"``, ``"hostbridge"``, ``"node"``, ``"system"``) or None.
    """

    driver_version: str | None = None
    cuda_version: str | None = None
    gpus: list[GpuInfo] = Field(default_factory=list)
    p2p: list[list[str | None]] = Field(default_factory=list)
    topology: list[list[str | None]] = Field(default_factory=list)

    @property
    def p2p_ok(self) -> bool | None:
        """True when every pair reports P2P ``ok``; None with fewer than two cards or no data."""
        cells = [c for i, row in enumerate(self.p2p) for j, c in enumerate(row) if i != j]
        if not cells or any(c is None for c in cells):
            return None
        return all(c == "ok" for c in cells)


class TelemetryDocument(BaseModel):
    """The JSON body of ``GET /sim/telemetry`` (and what ``HttpGpuSource`` accepts).

    ``{"schema": "vllm-dyno.gpu-telemetry/1", "status": {"state": "ok", "message": ""},
    "session": {SessionInfo}, "readings": [{GpuReading}, …]}``
    """

    model_config = ConfigDict(populate_by_name=True)

    schema_: str = Field(SCHEMA, alias="schema")
    status: SourceStatus = Field(default_factory=SourceStatus)
    session: SessionInfo = Field(default_factory=SessionInfo)
    readings: list[GpuReading] = Field(default_factory=list)

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)


@runtime_checkable
class GpuSource(Protocol):
    """What the GPU sampler needs from a source. No method raises for device trouble:
    errors become :class:`SourceStatus` states or None fields."""

    def open(self) -> SourceStatus:
        """Connect (``nvmlInit`` / first request); safe to call once."""

    def session_info(self) -> SessionInfo:
        """Once-per-session facts (call after a successful :meth:`open`)."""

    def read(self) -> list[GpuReading]:
        """One reading per selected card, in selection order."""

    def close(self) -> None:
        """Release the library / connection (idempotent)."""
