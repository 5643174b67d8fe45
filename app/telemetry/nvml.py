"""The one entry point to NVML (nvidia-ml-py, ``import pynvml``) in the app.

No other module under ``app/`` imports ``pynvml`` (tests/integration/test_layering.py checks it):
telemetry sampling (:class:`app.telemetry.nvml_source.NvmlSource`), the planner's card
list (:func:`app.planner.gpus.gpus_from_nvml`), the hardware fingerprint and the
leftover-process scan (:func:`app.server.procs.find_leftovers`) all come through here.

Every function takes ``nvml``: the module to use — default ``import pynvml``; tests pass
a double of the same shape (``tests/nvml_double.py``). A missing library or driver is
:class:`NvmlUnavailable` with a sentence for the user, never an ImportError or a bare
``NVMLError``.

Units: NVML reports memory in bytes; ``*_gib`` figures are GiB (2**30 bytes). Function
names and return shapes are those of the NVML API reference (``nvmlDeviceGetMemoryInfo``
→ ``total``/``used``/``free`` bytes, ``nvmlDeviceGetCudaComputeCapability`` → (major,
minor), ``nvmlDeviceGetComputeRunningProcesses`` → ``pid``/``usedGpuMemory`` bytes).

Memory is read by :func:`memory_info`, the one reader of ``nvmlDeviceGetMemoryInfo``:
version 2 first (``nvmlMemory_v2_t``: ``reserved`` — "device memory reserved for system
use (driver or firmware)" — apart from ``used``, "allocated device memory"), else version
1, whose ``used`` is the "sum of reserved and allocated device memory" (NVML API
reference, ``nvmlMemory_t`` and ``nvmlMemory_v2_t``); the reading then says so.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

GIB = 2**30

#: nvmlInit errors (by class name) → (state, message for the user); states are
#: app.telemetry.gpu_source.SourceState values
INIT_ERRORS = {
    "NVMLError_LibraryNotFound": ("no_driver", "no NVIDIA driver found (libnvidia-ml is not installed)"),
    "NVMLError_DriverNotLoaded": ("no_driver", "the NVIDIA driver is not loaded"),
    "NVMLError_LibRmVersionMismatch": ("driver_mismatch",
                                       "driver and library versions differ: reboot or reload the module"),
    "NVMLError_NoPermission": ("no_permission", "no permission to talk to the NVIDIA driver"),
}


#: errors of the version-2 memory call that mean "this driver has no version 2" (the reading
#: falls back to version 1 and says so): nvidia-ml-py raises FunctionNotFound when
#: libnvidia-ml has no ``nvmlDeviceGetMemoryInfo_v2`` (an older driver), the driver
#: answers ArgumentVersionMismatch for a struct version it does not know and NotSupported
#: where it does not report reserved memory (pynvml.py: nvmlDeviceGetMemoryInfo(handle,
#: version=nvmlMemory_v2) → _nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo_v2"))
MEMORY_V2_UNAVAILABLE = ("NVMLError_FunctionNotFound", "NVMLError_NotSupported", "NVMLError_ArgumentVersionMismatch")


class NvmlUnavailable(RuntimeError):
    """NVML cannot be used: ``state`` (``no_driver`` — no library or driver,
    ``driver_mismatch``, ``no_permission``, ``error``) and ``message``, a sentence for
    the user (also ``str(e)``)."""

    def __init__(self, state: str, message: str) -> None:
        super().__init__(message)
        self.state = state
        self.message = message


def text(v: Any) -> str:
    """An NVML string (bytes in older nvidia-ml-py releases) as ``str``."""
    return v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else str(v)


def reason(e: BaseException) -> str:
    """An NVML error as a short lower-case reason ("not supported"); for a code
    nvidia-ml-py has no text for ("NVML Error with code 25") the words of its class name
    (``NVMLError_ArgumentVersionMismatch`` → "argument version mismatch"); else the
    class name."""
    s = str(e).strip()
    name = type(e).__name__
    if (not s or s.startswith("NVML Error with code")) and name.startswith("NVMLError_"):
        return re.sub(r"(?<!^)(?=[A-Z])", " ", name[len("NVMLError_"):]).lower()
    return s.lower() if s else name


def load(nvml: Any = None) -> Any:
    """The NVML module: ``nvml`` when given, else ``import pynvml``. Raises
    :class:`NvmlUnavailable` (``no_driver``) when nvidia-ml-py is not installed."""
    if nvml is not None:
        return nvml
    try:
        import pynvml  # optional: without nvidia-ml-py NVML is unavailable, not an error at import
    except ImportError as e:
        raise NvmlUnavailable("no_driver", f"nvidia-ml-py is not installed ({e})") from None
    return pynvml


def start(nvml: Any = None) -> Any:
    """:func:`load` and ``nvmlInit``; returns the module, to be ended with :func:`stop`.
    Raises :class:`NvmlUnavailable` with the state and sentence of :data:`INIT_ERRORS`
    (e.g. ``no_driver``: "no NVIDIA driver found …")."""
    n = load(nvml)
    try:
        n.nvmlInit()
    except Exception as e:  # NVMLError_*, or OSError and the like from ctypes
        state, msg = INIT_ERRORS.get(type(e).__name__, ("error", f"NVML could not start: {reason(e)}"))
        raise NvmlUnavailable(state, msg) from e
    return n


def stop(n: Any) -> None:
    """``nvmlShutdown``; an error there is ignored (nothing left to do about it)."""
    try:
        n.nvmlShutdown()
    except Exception:
        pass


@contextlib.contextmanager
def nvml_session(nvml: Any = None) -> Iterator[Any]:
    """``with nvml_session() as n:`` — NVML initialised for the block (``n`` is the
    module), shut down after it. Raises :class:`NvmlUnavailable` on entry when the
    library or driver is missing."""
    n = start(nvml)
    try:
        yield n
    finally:
        stop(n)


@dataclass(frozen=True)
class MemoryInfo:
    """A card's memory as NVML reports it, bytes. ``used_bytes``: NVML's ``used`` — with
    version 2 the allocations only, with version 1 allocations plus driver-reserved
    memory. ``reserved_bytes``: driver/firmware-reserved memory (version 2), None when
    only version 1 answered; ``v2_unavailable`` then says why (a short reason, e.g.
    "function not found"), else None."""

    total_bytes: int
    used_bytes: int
    free_bytes: int
    reserved_bytes: int | None = None
    v2_unavailable: str | None = None

    @property
    def busy_bytes(self) -> int:
        """Memory a new process cannot have: total − free (allocations of every process
        plus driver-reserved memory, under either version)."""
        return self.total_bytes - self.free_bytes


def memory_info(n: Any, handle: Any, v2: bool = True) -> MemoryInfo:
    """``nvmlDeviceGetMemoryInfo`` of ``handle`` through module ``n``: version 2 (``version=
    n.nvmlMemory_v2``) unless ``v2`` is False, else — or when the driver or nvidia-ml-py
    has no version 2 (:data:`MEMORY_V2_UNAVAILABLE`; a module without ``nvmlMemory_v2``)
    — version 1, with the reason in ``v2_unavailable``. Any other NVML error is raised
    (``NVMLError_GpuIsLost`` included) for the caller to handle."""
    why: str | None = None
    version = getattr(n, "nvmlMemory_v2", None)
    if not v2:
        why = "version 2 not available"
    elif version is None:
        why = "this nvidia-ml-py has no nvmlMemory_v2"
    else:
        try:
            m = n.nvmlDeviceGetMemoryInfo(handle, version=version)
            return MemoryInfo(int(m.total), int(m.used), int(m.free), int(m.reserved))
        except Exception as e:
            if type(e).__name__ not in MEMORY_V2_UNAVAILABLE:
                raise
            why = reason(e)
    m = n.nvmlDeviceGetMemoryInfo(handle)
    return MemoryInfo(int(m.total), int(m.used), int(m.free), None, why)


@dataclass(frozen=True)
class CardInfo:
    """One card as NVML reports it: ``index`` (NVML index), ``name``, memory in bytes
    (``memory_total_bytes``; ``memory_used_bytes`` NVML's ``used``, see
    :class:`MemoryInfo`; ``memory_free_bytes``; ``memory_reserved_bytes`` None where
    only version 1 answered, ``reserved_unavailable`` then says why),
    ``compute_capability`` (major, minor) or None when not reported."""

    index: int
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    compute_capability: tuple[int, int] | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    reserved_unavailable: str | None = None

    @property
    def busy_bytes(self) -> int:
        """Memory a new process cannot have, bytes: total − free (other processes'
        allocations plus driver-reserved memory); total − used when free is unknown."""
        if self.memory_free_bytes is not None:
            return self.memory_total_bytes - self.memory_free_bytes
        return self.memory_used_bytes + (self.memory_reserved_bytes or 0)

    @property
    def memory_gib(self) -> float:
        """Total memory, GiB."""
        return self.memory_total_bytes / GIB

    @property
    def used_gib(self) -> float:
        """NVML's ``used``, GiB (see :class:`MemoryInfo` for what it includes)."""
        return self.memory_used_bytes / GIB


@dataclass(frozen=True)
class CardsInfo:
    """The selected cards of this machine: ``cards`` in the order asked for, ``count``
    (every card on the machine, selected or not), ``driver`` (NVIDIA driver version, None
    when not reported)."""

    cards: tuple[CardInfo, ...]
    count: int
    driver: str | None = None

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.cards]

    @property
    def memory_gib(self) -> list[float]:
        """Total memory per selected card, GiB."""
        return [c.memory_gib for c in self.cards]

    @property
    def used_gib(self) -> list[float]:
        """NVML's ``used`` per selected card, GiB."""
        return [c.used_gib for c in self.cards]


def read_cards(indices: Sequence[int] | None = None, nvml: Any = None) -> CardsInfo:
    """Name, memory and compute capability of the cards ``indices`` (NVML indices; all
    when None) and the driver version, in one NVML session.

    Raises :class:`NvmlUnavailable` when NVML cannot start or cannot read a card's name
    or memory, ValueError for an index the machine does not have.
    """
    with nvml_session(nvml) as n:
        try:
            count = int(n.nvmlDeviceGetCount())
        except Exception as e:
            raise NvmlUnavailable("error", f"NVML could not count the GPUs: {reason(e)}") from e
        idx = list(range(count)) if indices is None else [int(i) for i in indices]
        bad = [i for i in idx if not 0 <= i < count]
        if bad:
            have = f", indices 0–{count - 1}" if count else ""
            raise ValueError(f"GPU index {bad} not present: this machine has {count} GPU(s){have}")
        try:
            driver: str | None = text(n.nvmlSystemGetDriverVersion())
        except Exception:
            driver = None
        cards = []
        for i in idx:
            try:
                h = n.nvmlDeviceGetHandleByIndex(i)
                name = text(n.nvmlDeviceGetName(h))
                mem = memory_info(n, h)
            except Exception as e:
                raise NvmlUnavailable("error", f"NVML could not read GPU {i}: {reason(e)}") from e
            try:
                major, minor = n.nvmlDeviceGetCudaComputeCapability(h)
                cc: tuple[int, int] | None = (int(major), int(minor))
            except Exception:
                cc = None
            cards.append(CardInfo(i, name, mem.total_bytes, mem.used_bytes, cc, mem.free_bytes, mem.reserved_bytes,
                                  mem.v2_unavailable))
    return CardsInfo(tuple(cards), count, driver)


def gpu_memory_by_pid(nvml: Any = None) -> dict[int, int] | None:
    """GPU memory per process id over all cards (bytes; compute and graphics processes,
    summed over cards; 0 where NVML does not report the amount, as in containers).
    None when NVML is not available."""
    try:
        n = start(nvml)
    except NvmlUnavailable:
        return None
    out: dict[int, int] = {}
    try:
        for i in range(int(n.nvmlDeviceGetCount())):
            h = n.nvmlDeviceGetHandleByIndex(i)
            for fn_name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                fn = getattr(n, fn_name, None)
                if fn is None:
                    continue
                try:
                    for pr in fn(h):
                        out[pr.pid] = out.get(pr.pid, 0) + int(pr.usedGpuMemory or 0)
                except Exception:
                    continue
    except Exception:
        pass  # a card that cannot be read: what was read so far
    finally:
        stop(n)
    return out
