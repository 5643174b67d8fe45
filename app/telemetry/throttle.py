"""Decode NVML clock throttle / event reasons.

The bit values are NVML's ``nvmlClocksEventReason*`` (formerly
``nvmlClocksThrottleReason*``) constants, as defined in ``nvml.h`` and the
``pynvml`` module (nvidia-ml-py 12.535+). Names here are the user-facing ones.
"""
from __future__ import annotations

#: bit → name, in NVML's bit order (source: nvml.h, nvmlClocksEventReason*)
REASONS: dict[int, str] = {
    0x001: "idle",
    0x002: "applications clocks setting",
    0x004: "power cap",
    0x008: "hardware slowdown",
    0x010: "sync boost",
    0x020: "thermal (software)",
    0x040: "thermal (hardware)",
    0x080: "power brake (hardware)",
    0x100: "display clock setting",
    0x200: "board limit",
    0x400: "reliability",
}

#: reasons that mean the card is being held back under load (thermal, power, hardware);
#: idle, application clocks, sync boost and display settings are not a problem.
LIMITING = 0x004 | 0x008 | 0x020 | 0x040 | 0x080 | 0x200 | 0x400


def decode(mask: int | None) -> list[str] | None:
    """Names of the bits set in ``mask`` (unknown bits as ``'bit 0x…'``); None stays None."""
    if mask is None:
        return None
    mask = int(mask)
    out = [name for bit, name in REASONS.items() if mask & bit]
    unknown = mask & ~sum(REASONS)
    b = 1
    while unknown:
        if unknown & b:
            out.append(f"bit 0x{b:x}")
            unknown &= ~b
        b <<= 1
    return out


def limiting(mask: int | None) -> int:
    """The limiting part of ``mask`` (0 when None)."""
    return 0 if mask is None else int(mask) & LIMITING
