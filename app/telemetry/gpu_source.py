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

from app.telemetry.names import GPU_READING_SERIES

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

    Memory (bytes, :func:`app.telemetry.nvml.memory_info`): ``memory_used_bytes`` is
    NVML's ``used`` — the allocations when ``memory_reserved_bytes`` (driver/firmware
    reserved, NVML memory info version 2) is given; allocations *plus* reserved memory
    when only version 1 answered, and then ``unavailable["memory_reserved_bytes"]`` says
    why (:meth:`memory_note` puts it in words). ``compute_capability``: (major, minor).
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
    memory_reserved_bytes: int | None = None
    compute_capability: tuple[int, int] | None = None
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
        """Memory a new allocation can still get, bytes: NVML's ``free`` (total − used −
        reserved); total − used − reserved when free is not given; None when total or
        used is not available."""
        if self.memory_free_bytes is not None:
            return self.memory_free_bytes
        if self.memory_total_bytes is None or self.memory_used_bytes is None:
            return None
        return self.memory_total_bytes - self.memory_used_bytes - (self.memory_reserved_bytes or 0)

    @property
    def busy_bytes(self) -> int | None:
        """Memory a new process cannot have, bytes: total − headroom (every process's
        allocations plus driver-reserved memory); None when not available."""
        head = self.vram_headroom_bytes
        return None if head is None or self.memory_total_bytes is None else self.memory_total_bytes - head

    @property
    def used_includes_reserved(self) -> bool:
        """True when ``memory_used_bytes`` is NVML version 1's figure, which counts
        driver-reserved memory as used (``unavailable`` names the reason)."""
        return (self.memory_used_bytes is not None and self.memory_reserved_bytes is None
                and "memory_reserved_bytes" in self.unavailable)

    def memory_note(self) -> str:
        """One sentence on what the memory figures hold, for a tooltip or a CLI note:
        the reserved share apart (version 2), or that ``used`` includes it and why
        (version 1); "" when memory is not reported."""
        if self.memory_used_bytes is None:
            return ""
        used = self.memory_used_bytes / 2**30
        if self.memory_reserved_bytes is not None:
            return (f"used {used:.2f} GiB allocated by processes; {self.memory_reserved_bytes / 2**30:.2f} GiB "
                    f"reserved by the driver, not counted as used (NVML memory info v2)")
        if self.used_includes_reserved:
            return (f"used {used:.2f} GiB includes memory the driver reserves: NVML memory info v2 is not "
                    f"available ({self.unavailable['memory_reserved_bytes']}), and v1 counts reserved memory as used")
        return ""


#: numeric reading fields that become time series (sample name = field name; declared in
#: app.telemetry.names with their units)
SERIES_FIELDS: tuple[str, ...] = GPU_READING_SERIES


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
