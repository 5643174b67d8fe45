"""GPU source over NVML (nvidia-ml-py, loaded through :mod:`app.telemetry.nvml`).

Every NVML call is wrapped: an error for one field gives None for that field (with the
reason in ``GpuReading.unavailable``), never an exception. Errors that cannot change
while the driver runs (``NotSupported``, ``FunctionNotFound``, ``NoPermission``,
``NotFound``) mark the field unsupported for the session: it is not called again.
``GpuIsLost`` marks the whole card lost; it is probed again every ``lost_retry_s``.

Costs on real hardware: ``nvmlDeviceGetPcieThroughput`` samples for ≈20 ms per call
(NVML API reference), so PCIe TX/RX is read for one card per round, in turn, and the
other cards keep their last values; compute processes are read every
``processes_every`` rounds.

Memory comes from :func:`app.telemetry.nvml.memory_info` (version 2, with the
driver-reserved share apart; version 1 where the driver has no version 2, and the reading's
``unavailable["memory_reserved_bytes"]`` says why — its ``used`` then includes reserved
memory).

Units: NVML gives power in mW (÷1000 → W), PCIe throughput in KB/s (×1024 → bytes/s),
memory in bytes, clocks in MHz, temperatures in °C, utilization and fan in %.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Sequence

from app.telemetry import throttle
from app.telemetry.gpu_source import GpuInfo, GpuProcess, GpuReading, SessionInfo, SourceStatus
from app.telemetry.nvml import MemoryInfo, NvmlUnavailable, memory_info, start, stop
from app.telemetry.nvml import reason as _reason
from app.telemetry.nvml import text as _text

log = logging.getLogger(__name__)

#: NVML errors that do not go away while the driver runs → the field is not retried
_PERMANENT = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission", "NVMLError_NotFound")

_P2P_STATUS = {0: "ok", 1: "chipset_not_supported", 2: "gpu_not_supported", 3: "ioh_topology_not_supported",
               4: "disabled_by_regkey", 5: "not_supported", 6: "unknown"}
_TOPOLOGY = {0: "internal", 10: "single", 20: "multiple", 30: "hostbridge", 40: "node", 50: "system"}


class _Lost(Exception):
    pass


class _Device:
    """Per-card state: handle, static facts, fields known to be unsupported, caches."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.handle: Any = None
        self.lost_reason: str | None = None
        self.lost_at = 0.0
        self.unsupported: dict[str, str] = {}
        self.static: dict[str, Any] = {}
        self.pcie: tuple[float | None, float | None] = (None, None)
        self.processes: list[GpuProcess] | None = None


class NvmlSource:
    """GPU source reading the selected cards through NVML.

    ``indices``: NVML indices to read (default: all cards). ``nvml``: the module to use
    (default ``import pynvml``, through :func:`app.telemetry.nvml.load`; tests pass a
    double of the same shape). ``server_pgid``:
    process group of the supervised server (settable at any time), used to mark its
    compute processes. ``lost_retry_s``: seconds between probes of a lost card.
    """

    def __init__(self, indices: Sequence[int] | None = None, *, nvml: Any = None, server_pgid: int | None = None,
                 lost_retry_s: float = 30.0, processes_every: int = 4,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.indices = None if indices is None else [int(i) for i in indices]
        self.nvml = nvml
        self.server_pgid = server_pgid
        self.lost_retry_s = lost_retry_s
        self.processes_every = max(1, int(processes_every))
        self._monotonic = monotonic
        self._devices: list[_Device] = []
        self._open = False
        self._round = 0
        self._pgid_cache: dict[int, int | None] = {}
        self.status = SourceStatus(state="closed", message="not opened")

    # ------------------------------------------------------------------ lifecycle
    def open(self) -> SourceStatus:
        """``nvmlInit`` and select the cards; returns the status (never raises)."""
        if self._open:
            return self.status
        try:
            n = self.nvml = start(self.nvml)
        except NvmlUnavailable as e:  # no library, no driver, driver mismatch, no permission
            self.status = SourceStatus(state=e.state, message=e.message)
            return self.status
        self._open = True
        try:
            count = int(n.nvmlDeviceGetCount())
        except n.NVMLError as e:
            self.status = SourceStatus(state="error", message=f"NVML could not count the GPUs: {_reason(e)}")
            return self.status
        if count == 0:
            self.status = SourceStatus(state="no_gpu", message="no NVIDIA GPU found")
            return self.status
        indices = list(range(count)) if self.indices is None else self.indices
        bad = [i for i in indices if not 0 <= i < count]
        if bad:
            self.status = SourceStatus(
                state="error", message=f"GPU index {bad} not present: this machine has {count} GPU(s), indices 0–{count - 1}")
            return self.status
        self._devices = [_Device(i) for i in indices]
        for d in self._devices:
            self._get_handle(d)
            if d.handle is not None:
                self._read_static(d)
        self.status = SourceStatus(state="ok", message=f"{len(indices)} of {count} GPU(s) selected")
        return self.status

    def close(self) -> None:
        if self._open:
            self._open = False
            stop(self.nvml)
        self.status = SourceStatus(state="closed", message="closed")

    # ------------------------------------------------------------------ calls
    def _get_handle(self, d: _Device) -> None:
        d.lost_at = self._monotonic()
        try:
            d.handle = self.nvml.nvmlDeviceGetHandleByIndex(d.index)
            d.lost_reason = None
        except Exception as e:
            d.handle = None
            d.lost_reason = _reason(e)
            log.warning("GPU %d: %s", d.index, d.lost_reason)

    def _call(self, d: _Device, field: str, fn_name: str, *args: Any) -> Any:
        """Call ``nvml.fn_name(handle, *args)``; None when not available (reason kept)."""
        if field in d.unsupported:
            return None
        fn = getattr(self.nvml, fn_name, None)
        if fn is None:
            d.unsupported[field] = f"{fn_name} is not in this nvidia-ml-py"
            return None
        return self._guarded(d, field, lambda: fn(d.handle, *args))

    def _guarded(self, d: _Device, field: str, read: Callable[[], Any]) -> Any:
        """``read()`` for ``field``; None when it fails: a permanent NVML error marks the
        field unsupported for the session, any other error is this tick's only;
        ``GpuIsLost`` raises :class:`_Lost`."""
        if field in d.unsupported:
            return None
        n = self.nvml
        try:
            return read()
        except n.NVMLError as e:
            name = type(e).__name__
            if name == "NVMLError_GpuIsLost":
                raise _Lost(_reason(e)) from None
            if name in _PERMANENT:
                d.unsupported[field] = _reason(e)
            else:
                self._transient[field] = _reason(e)
            return None
        except Exception as e:  # anything else from ctypes: this tick only
            self._transient[field] = _reason(e)
            return None

    def _memory(self, d: _Device) -> MemoryInfo | None:
        """The card's memory (:func:`app.telemetry.nvml.memory_info`): version 2 until this
        card's driver is found without it, then version 1 — the reason stays in
        ``unsupported["memory_reserved_bytes"]`` (the reading's ``unavailable``: its
        ``used`` includes reserved memory). None when memory cannot be read."""
        v2 = "memory_reserved_bytes" not in d.unsupported
        m = self._guarded(d, "memory", lambda: memory_info(self.nvml, d.handle, v2=v2))
        if m is not None and m.v2_unavailable is not None:
            d.unsupported.setdefault("memory_reserved_bytes", m.v2_unavailable)
        return m

    def _read_static(self, d: _Device) -> None:
        n = self.nvml
        s: dict[str, Any] = {}
        self._transient = {}
        try:
            v = self._call(d, "name", "nvmlDeviceGetName")
            s["name"] = None if v is None else _text(v)
            v = self._call(d, "uuid", "nvmlDeviceGetUUID")
            s["uuid"] = None if v is None else _text(v)
            v = self._call(d, "pci_bus_id", "nvmlDeviceGetPciInfo")
            s["pci_bus_id"] = None if v is None else _text(getattr(v, "busId", v))
            v = self._call(d, "mig_mode", "nvmlDeviceGetMigMode")
            s["mig_mode"] = None if v is None else bool(v[0])
            v = self._call(d, "compute_capability", "nvmlDeviceGetCudaComputeCapability")
            s["compute_capability"] = None if v is None else (int(v[0]), int(v[1]))
            for key, thr in (("temp_slowdown_c", "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN"),
                             ("temp_shutdown_c", "NVML_TEMPERATURE_THRESHOLD_SHUTDOWN")):
                v = self._call(d, key, "nvmlDeviceGetTemperatureThreshold", getattr(n, thr))
                s[key] = None if v is None else float(v)
        except _Lost as e:
            d.handle, d.lost_reason, d.lost_at = None, str(e), self._monotonic()
        d.static = s

    # ------------------------------------------------------------------ session
    def session_info(self) -> SessionInfo:
        """Driver and CUDA versions, the cards, P2P read status and topology between them."""
        if not self._open or not self.status.ok:
            return SessionInfo()
        n = self.nvml
        info = SessionInfo()
        try:
            info.driver_version = _text(n.nvmlSystemGetDriverVersion())
        except Exception as e:
            log.info("driver version not available: %s", _reason(e))
        try:
            v = int(n.nvmlSystemGetCudaDriverVersion())  # e.g. 12040 → 12.4 (nvml.h: major*1000 + minor*10)
            info.cuda_version = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception as e:
            log.info("CUDA version not available: %s", _reason(e))
        for d in self._devices:
            s = d.static
            mem = None
            if d.handle is not None:
                self._transient = {}
                try:
                    m = self._memory(d)
                    mem = None if m is None else m.total_bytes
                except _Lost:
                    pass
            info.gpus.append(GpuInfo(index=d.index, name=s.get("name"), uuid=s.get("uuid"),
                                     pci_bus_id=s.get("pci_bus_id"), compute_capability=s.get("compute_capability"),
                                     memory_total_bytes=mem, mig_mode=s.get("mig_mode")))
        k = len(self._devices)
        info.p2p = [[None] * k for _ in range(k)]
        info.topology = [[None] * k for _ in range(k)]
        read_idx = n.NVML_P2P_CAPS_INDEX_READ
        read_idx = read_idx[0] if isinstance(read_idx, tuple) else read_idx  # pynvml defines it as (0,)
        for i, a in enumerate(self._devices):
            for j, b in enumerate(self._devices):
                if i == j or a.handle is None or b.handle is None:
                    continue
                try:
                    info.p2p[i][j] = _P2P_STATUS.get(int(n.nvmlDeviceGetP2PStatus(a.handle, b.handle, read_idx)),
                                                     "unknown")
                except Exception as e:
                    log.info("P2P status %d→%d not available: %s", a.index, b.index, _reason(e))
                try:
                    info.topology[i][j] = _TOPOLOGY.get(int(n.nvmlDeviceGetTopologyCommonAncestor(a.handle, b.handle)))
                except Exception as e:
                    log.info("topology %d→%d not available: %s", a.index, b.index, _reason(e))
        return info

    # ------------------------------------------------------------------ readings
    def read(self) -> list[GpuReading]:
        """One reading per selected card (lost cards: ``state='lost'``, every field None)."""
        if not self._open or not self.status.ok:
            return []
        self._round += 1
        out = []
        k = len(self._devices)
        for pos, d in enumerate(self._devices):
            if d.handle is None:
                if self._monotonic() - d.lost_at >= self.lost_retry_s:
                    self._get_handle(d)
                    if d.handle is not None:
                        log.warning("GPU %d is back", d.index)
                        self._read_static(d)
                if d.handle is None:
                    out.append(self._lost_reading(d))
                    continue
            try:
                out.append(self._read_one(d, pcie_turn=(self._round % k) == pos,
                                          processes_turn=(self._round - 1) % self.processes_every == 0))
            except _Lost as e:
                d.handle, d.lost_reason, d.lost_at = None, str(e), self._monotonic()
                log.warning("GPU %d: %s", d.index, d.lost_reason)
                out.append(self._lost_reading(d))
        return out

    def _lost_reading(self, d: _Device) -> GpuReading:
        s = d.static
        return GpuReading(index=d.index, state="lost", name=s.get("name"), uuid=s.get("uuid"),
                          pci_bus_id=s.get("pci_bus_id"), unavailable={"*": d.lost_reason or "GPU is lost"})

    def _read_one(self, d: _Device, pcie_turn: bool, processes_turn: bool) -> GpuReading:
        n = self.nvml
        self._transient: dict[str, str] = {}
        call = self._call
        r: dict[str, Any] = {"index": d.index}
        s = d.static
        for key in ("name", "uuid", "pci_bus_id", "mig_mode", "compute_capability", "temp_slowdown_c",
                    "temp_shutdown_c"):
            r[key] = s.get(key)
        m = self._memory(d)
        if m is not None:
            r["memory_total_bytes"], r["memory_used_bytes"] = m.total_bytes, m.used_bytes
            r["memory_free_bytes"], r["memory_reserved_bytes"] = m.free_bytes, m.reserved_bytes
        u = call(d, "utilization", "nvmlDeviceGetUtilizationRates")
        if u is not None:
            r["util_gpu_pct"], r["util_memory_pct"] = float(u.gpu), float(u.memory)
        v = call(d, "temp_gpu_c", "nvmlDeviceGetTemperature", n.NVML_TEMPERATURE_GPU)
        r["temp_gpu_c"] = None if v is None else float(v)
        r["temp_memory_c"] = self._memory_temp(d)
        v = call(d, "power_w", "nvmlDeviceGetPowerUsage")
        r["power_w"] = None if v is None else v / 1000.0
        v = call(d, "power_limit_w", "nvmlDeviceGetEnforcedPowerLimit")
        r["power_limit_w"] = None if v is None else v / 1000.0
        v = call(d, "clock_sm_mhz", "nvmlDeviceGetClockInfo", n.NVML_CLOCK_SM)
        r["clock_sm_mhz"] = None if v is None else float(v)
        v = call(d, "clock_mem_mhz", "nvmlDeviceGetClockInfo", n.NVML_CLOCK_MEM)
        r["clock_mem_mhz"] = None if v is None else float(v)
        if hasattr(n, "nvmlDeviceGetCurrentClocksEventReasons"):
            v = call(d, "throttle_reasons", "nvmlDeviceGetCurrentClocksEventReasons")
        else:  # nvidia-ml-py before 12.535
            v = call(d, "throttle_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
        r["throttle_reasons"] = None if v is None else int(v)
        r["throttle"] = throttle.decode(r["throttle_reasons"])
        if pcie_turn:
            tx = call(d, "pcie_tx_bytes_per_s", "nvmlDeviceGetPcieThroughput", n.NVML_PCIE_UTIL_TX_BYTES)
            rx = call(d, "pcie_rx_bytes_per_s", "nvmlDeviceGetPcieThroughput", n.NVML_PCIE_UTIL_RX_BYTES)
            d.pcie = (None if tx is None else tx * 1024.0, None if rx is None else rx * 1024.0)
        r["pcie_tx_bytes_per_s"], r["pcie_rx_bytes_per_s"] = d.pcie
        v = call(d, "fan_pct", "nvmlDeviceGetFanSpeed")
        r["fan_pct"] = None if v is None else float(v)
        if processes_turn or d.processes is None:
            procs = call(d, "processes", "nvmlDeviceGetComputeRunningProcesses")
            if procs is not None:
                d.processes = [GpuProcess(pid=int(p.pid), used_memory_bytes=_opt_int(getattr(p, "usedGpuMemory", None)),
                                          server=self._is_server(int(p.pid))) for p in procs]
        r["processes"] = d.processes
        una = dict(d.unsupported)
        una.update(self._transient)
        # fields that share one call
        for call_key, fields in (("memory", ("memory_total_bytes", "memory_used_bytes", "memory_free_bytes",
                                             "memory_reserved_bytes")),
                                 ("utilization", ("util_gpu_pct", "util_memory_pct"))):
            if call_key in una:
                why = una.pop(call_key)
                for f in fields:
                    una[f] = why
        if "throttle_reasons" in una:
            una["throttle"] = una["throttle_reasons"]
        r["unavailable"] = una
        return GpuReading(**r)

    def _memory_temp(self, d: _Device) -> float | None:
        """Memory (HBM/GDDR) temperature via field value NVML_FI_DEV_MEMORY_TEMP, when the card has it."""
        n = self.nvml
        vals = self._call(d, "temp_memory_c", "nvmlDeviceGetFieldValues", [n.NVML_FI_DEV_MEMORY_TEMP])
        if vals is None:
            return None
        fv = vals[0]
        if fv.nvmlReturn != n.NVML_SUCCESS:
            err = n.NVMLError(fv.nvmlReturn)
            if type(err).__name__ in _PERMANENT:
                d.unsupported["temp_memory_c"] = _reason(err)
            else:
                self._transient["temp_memory_c"] = _reason(err)
            return None
        return float(fv.value.uiVal)

    def _is_server(self, pid: int) -> bool:
        pg = self.server_pgid
        if pg is None:
            return False
        if pid not in self._pgid_cache:
            if len(self._pgid_cache) > 4096:
                self._pgid_cache.clear()
            try:
                self._pgid_cache[pid] = os.getpgid(pid)
            except OSError:  # not visible from here (other namespace) or gone
                self._pgid_cache[pid] = None
        return self._pgid_cache[pid] == pg


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)

