"""A stand-in for the ``pynvml`` module at the hardware boundary (tests and benchmarks;
not shipped in the ``app`` package). Pass it as ``nvml=`` to the functions of
:mod:`app.telemetry.nvml` and to :class:`app.telemetry.nvml_source.NvmlSource`.

Shaped like the real module: the same function names and signatures for the calls the
app makes, the real ``NVML_*`` constants and the real ``NVMLError`` classes (copied from
the installed nvidia-ml-py, so ``except pynvml.NVMLError_NotSupported`` works on
either), real ctypes result structures where the real module returns them.

Each card is a :class:`FakeGpu`; ``raises`` maps a function name to an ``NVMLError_*``
class name raised for that card, ``returns`` maps a function name to a value returned
instead of the default. Memory info has two versions, as in nvidia-ml-py:
``nvmlDeviceGetMemoryInfo(h)`` (v1, ``c_nvmlMemory_t``: ``used`` = allocations + reserved)
and ``nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)`` (the C function
``nvmlDeviceGetMemoryInfo_v2``, ``c_nvmlMemory_v2_t``: ``reserved`` apart); key
``"nvmlDeviceGetMemoryInfo_v2"`` in ``raises`` makes only the v2 call fail, as an older
driver does (``NVMLError_FunctionNotFound`` — nvidia-ml-py's answer when libnvidia-ml has
no such symbol — ``NVMLError_ArgumentVersionMismatch`` or ``NVMLError_NotSupported``);
``del double.nvmlMemory_v2`` is an nvidia-ml-py without version 2. ``init_raises`` makes
``nvmlInit`` fail; :meth:`NvmlDouble.lose` makes a card fall off the bus (every later call
for it raises ``NVMLError_GpuIsLost``). ``calls`` counts calls per ``(function name, card
index)``; a v2 memory call counts under ``nvmlDeviceGetMemoryInfo_v2`` too.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml as _real

GiB = 2**30


@dataclass
class FakeGpu:
    """One simulated card; values in NVML's own units (mW, KB/s, bytes, MHz, °C, %)."""

    index: int
    name: str = "NVIDIA GeForce RTX 4090"
    memory_total: int = 24 * GiB
    memory_used: int = 1 * GiB  # allocations (v2 ``used``); v1 ``used`` adds memory_reserved
    memory_reserved: int = 0  # driver/firmware reserved (v2 ``reserved``)
    util_gpu: int = 0
    util_memory: int = 0
    temp: int = 35
    temp_memory: int | None = None  # None → field value NOT_SUPPORTED (GDDR cards)
    temp_slowdown: int = 90
    temp_shutdown: int = 95
    power_mw: int = 30_000
    power_limit_mw: int = 450_000
    clock_sm: int = 210
    clock_mem: int = 405
    throttle: int = 0x1  # idle
    pcie_tx_kbs: int = 1000
    pcie_rx_kbs: int = 2000
    fan: int = 30
    cc: tuple[int, int] = (8, 9)
    mig: tuple[int, int] = (0, 0)
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes)
    raises: dict[str, str] = field(default_factory=dict)
    returns: dict[str, Any] = field(default_factory=dict)

    @property
    def uuid(self) -> str:
        return f"GPU-00000000-0000-0000-0000-{self.index:012d}"

    @property
    def bus_id(self) -> str:
        return f"00000000:{0x18 + self.index:02X}:00.0"


class _Handle:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class NvmlDouble:
    """A ``pynvml``-shaped object over a list of :class:`FakeGpu` cards.

    ``p2p``: status for every pair (NVML_P2P_STATUS_*; consumer cards: 2 = GPU not
    supported). ``topology``: common ancestor level for every pair.
    """

    def __init__(self, gpus: list[FakeGpu] | int = 8, *, init_raises: str | None = None, driver: str = "550.54.15",
                 cuda: int = 12040, p2p: int = 2, topology: int = 30) -> None:
        for k, v in vars(_real).items():
            if k.startswith(("NVML_", "NVMLError", "nvmlClocks", "c_nvml")):
                setattr(self, k, v)
        self.NVMLError = _real.NVMLError
        self.nvmlMemory_v2 = _real.nvmlMemory_v2
        self.gpus = [FakeGpu(i) for i in range(gpus)] if isinstance(gpus, int) else list(gpus)
        self.init_raises = init_raises
        self.driver, self.cuda, self.p2p, self.topology = driver, cuda, p2p, topology
        self.initialized = False
        self.calls: collections.Counter[tuple[str, int | None]] = collections.Counter()
        self._lost: set[int] = set()

    # ------------------------------------------------------------------ control
    def lose(self, index: int) -> None:
        """Card ``index`` falls off the bus."""
        self._lost.add(index)

    def recover(self, index: int) -> None:
        self._lost.discard(index)

    def _err(self, name: str) -> Exception:
        return getattr(_real, name)()

    def _enter(self, fn: str, handle: _Handle | None) -> FakeGpu | None:
        idx = None if handle is None else handle.index
        self.calls[(fn, idx)] += 1
        if not self.initialized:
            raise self._err("NVMLError_Uninitialized")
        if idx is None:
            return None
        if idx in self._lost:
            raise self._err("NVMLError_GpuIsLost")
        g = self.gpus[idx]
        if fn in g.raises:
            raise self._err(g.raises[fn])
        return g

    def _ret(self, g: FakeGpu, fn: str, default: Any) -> Any:
        return g.returns[fn] if fn in g.returns else default

    # ------------------------------------------------------------------ system
    def nvmlInit(self) -> None:
        self.calls[("nvmlInit", None)] += 1
        if self.init_raises:
            raise self._err(self.init_raises)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self.calls[("nvmlShutdown", None)] += 1
        self.initialized = False

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount", None)
        return len(self.gpus)

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion", None)
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion", None)
        return self.cuda

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self.calls[("nvmlDeviceGetHandleByIndex", index)] += 1
        if not self.initialized:
            raise self._err("NVMLError_Uninitialized")
        if not 0 <= index < len(self.gpus):
            raise self._err("NVMLError_InvalidArgument")
        if index in self._lost:
            raise self._err("NVMLError_GpuIsLost")
        g = self.gpus[index]
        if "nvmlDeviceGetHandleByIndex" in g.raises:
            raise self._err(g.raises["nvmlDeviceGetHandleByIndex"])
        return _Handle(index)

    # ------------------------------------------------------------------ device
    def nvmlDeviceGetName(self, h: _Handle) -> str:
        g = self._enter("nvmlDeviceGetName", h)
        return self._ret(g, "nvmlDeviceGetName", g.name)

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:
        g = self._enter("nvmlDeviceGetUUID", h)
        return self._ret(g, "nvmlDeviceGetUUID", g.uuid)

    def nvmlDeviceGetPciInfo(self, h: _Handle) -> Any:
        g = self._enter("nvmlDeviceGetPciInfo", h)
        info = _real.nvmlPciInfo_t()
        info.busId = g.bus_id.encode()
        return self._ret(g, "nvmlDeviceGetPciInfo", info)

    def nvmlDeviceGetMigMode(self, h: _Handle) -> list[int]:
        g = self._enter("nvmlDeviceGetMigMode", h)
        return list(self._ret(g, "nvmlDeviceGetMigMode", g.mig))

    def nvmlDeviceGetCudaComputeCapability(self, h: _Handle) -> tuple[int, int]:
        g = self._enter("nvmlDeviceGetCudaComputeCapability", h)
        return tuple(self._ret(g, "nvmlDeviceGetCudaComputeCapability", g.cc))

    def nvmlDeviceGetTemperatureThreshold(self, h: _Handle, threshold: int) -> int:
        g = self._enter("nvmlDeviceGetTemperatureThreshold", h)
        v = g.temp_shutdown if threshold == _real.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN else g.temp_slowdown
        return self._ret(g, "nvmlDeviceGetTemperatureThreshold", v)

    def nvmlDeviceGetMemoryInfo(self, h: _Handle, version: Any = None) -> Any:
        g = self._enter("nvmlDeviceGetMemoryInfo", h)
        used_v1 = g.memory_used + g.memory_reserved
        free = g.memory_total - used_v1
        if not version:  # pynvml: c_nvmlMemory_t through nvmlDeviceGetMemoryInfo
            m = _real.c_nvmlMemory_t(total=g.memory_total, free=free, used=used_v1)
            return self._ret(g, "nvmlDeviceGetMemoryInfo", m)
        # pynvml: c_nvmlMemory_v2_t with .version set, through nvmlDeviceGetMemoryInfo_v2
        self.calls[("nvmlDeviceGetMemoryInfo_v2", h.index)] += 1
        if "nvmlDeviceGetMemoryInfo_v2" in g.raises:
            raise self._err(g.raises["nvmlDeviceGetMemoryInfo_v2"])
        if version != _real.nvmlMemory_v2:
            raise self._err("NVMLError_ArgumentVersionMismatch")
        m = _real.c_nvmlMemory_v2_t(version=version, total=g.memory_total, reserved=g.memory_reserved, free=free,
                                    used=g.memory_used)
        return self._ret(g, "nvmlDeviceGetMemoryInfo_v2", m)

    def nvmlDeviceGetUtilizationRates(self, h: _Handle) -> Any:
        g = self._enter("nvmlDeviceGetUtilizationRates", h)
        return self._ret(g, "nvmlDeviceGetUtilizationRates", _real.c_nvmlUtilization_t(gpu=g.util_gpu, memory=g.util_memory))

    def nvmlDeviceGetTemperature(self, h: _Handle, sensor: int) -> int:
        g = self._enter("nvmlDeviceGetTemperature", h)
        return self._ret(g, "nvmlDeviceGetTemperature", g.temp)

    def nvmlDeviceGetFieldValues(self, h: _Handle, field_ids: list[int]) -> Any:
        g = self._enter("nvmlDeviceGetFieldValues", h)
        arr = (_real.c_nvmlFieldValue_t * len(field_ids))()
        for i, fid in enumerate(field_ids):
            arr[i].fieldId = fid
            if fid == _real.NVML_FI_DEV_MEMORY_TEMP and g.temp_memory is not None:
                arr[i].nvmlReturn = _real.NVML_SUCCESS
                arr[i].value.uiVal = g.temp_memory
            else:
                arr[i].nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
        return arr

    def nvmlDeviceGetPowerUsage(self, h: _Handle) -> int:
        g = self._enter("nvmlDeviceGetPowerUsage", h)
        return self._ret(g, "nvmlDeviceGetPowerUsage", g.power_mw)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: _Handle) -> int:
        g = self._enter("nvmlDeviceGetEnforcedPowerLimit", h)
        return self._ret(g, "nvmlDeviceGetEnforcedPowerLimit", g.power_limit_mw)

    def nvmlDeviceGetClockInfo(self, h: _Handle, clock_type: int) -> int:
        g = self._enter("nvmlDeviceGetClockInfo", h)
        return self._ret(g, "nvmlDeviceGetClockInfo", g.clock_sm if clock_type == _real.NVML_CLOCK_SM else g.clock_mem)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: _Handle) -> int:
        g = self._enter("nvmlDeviceGetCurrentClocksEventReasons", h)
        return self._ret(g, "nvmlDeviceGetCurrentClocksEventReasons", g.throttle)

    def nvmlDeviceGetPcieThroughput(self, h: _Handle, counter: int) -> int:
        g = self._enter("nvmlDeviceGetPcieThroughput", h)
        return self._ret(g, "nvmlDeviceGetPcieThroughput",
                         g.pcie_tx_kbs if counter == _real.NVML_PCIE_UTIL_TX_BYTES else g.pcie_rx_kbs)

    def nvmlDeviceGetFanSpeed(self, h: _Handle) -> int:
        g = self._enter("nvmlDeviceGetFanSpeed", h)
        return self._ret(g, "nvmlDeviceGetFanSpeed", g.fan)

    def nvmlDeviceGetComputeRunningProcesses(self, h: _Handle) -> list[Any]:
        g = self._enter("nvmlDeviceGetComputeRunningProcesses", h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                for pid, used in self._ret(g, "nvmlDeviceGetComputeRunningProcesses", g.processes)]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: _Handle) -> list[Any]:
        g = self._enter("nvmlDeviceGetGraphicsRunningProcesses", h)
        return [SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
                for pid, used in self._ret(g, "nvmlDeviceGetGraphicsRunningProcesses", [])]

    def nvmlDeviceGetP2PStatus(self, h1: _Handle, h2: _Handle, p2p_index: int) -> int:
        self._enter("nvmlDeviceGetP2PStatus", h1)
        self._enter("nvmlDeviceGetP2PStatus", h2)
        return self.p2p

    def nvmlDeviceGetTopologyCommonAncestor(self, h1: _Handle, h2: _Handle) -> int:
        self._enter("nvmlDeviceGetTopologyCommonAncestor", h1)
        self._enter("nvmlDeviceGetTopologyCommonAncestor", h2)
        return self.topology


#: the functions of the double, each of which exists in the real module
FUNCTIONS = tuple(k for k in vars(NvmlDouble) if k.startswith("nvml"))
