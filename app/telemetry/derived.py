"""Series derived from telemetry, per ramp level.

A level span is ``(level, t_start, t_end)``: any label (e.g. the concurrency) and its
start/end in session-clock seconds. Series are ``(t, values)`` numpy arrays as
:meth:`SeriesBank.get` returns them (NaN = gap, ignored).

- VRAM headroom per GPU: the bytes still free (the GPU sampler emits NVML's free,
  total − used − reserved, as ``vram_headroom_bytes``; :func:`vram_headroom` for
  arrays of total and everything held).
- Energy per output token per level: ∫ Σ_gpus P dt (trapezoid rule over the samples,
  values at the level's edges interpolated) ÷ tokens generated in the level → J/token.
- Throttle events per level: onsets of a limiting NVML clock-event reason (thermal,
  power cap, hardware slowdown, …; idle and application clocks do not count) inside
  the level, plus one at the level's start when it began throttled.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from app.telemetry import names, throttle

Series = tuple[np.ndarray, np.ndarray]
LevelSpan = tuple[Any, float, float]


def _finite(s: Series) -> Series:
    t, v = np.asarray(s[0], dtype=float), np.asarray(s[1], dtype=float)
    ok = np.isfinite(v) & np.isfinite(t)
    return t[ok], v[ok]


def vram_headroom(total: np.ndarray, used: np.ndarray) -> np.ndarray:
    """Bytes free for growth: ``total − used`` elementwise (same shapes)."""
    return np.asarray(total, dtype=float) - np.asarray(used, dtype=float)


def integrate(series: Series, t0: float, t1: float) -> float | None:
    """∫ v dt over [t0, t1] (value·seconds) by the trapezoid rule; the series is
    interpolated at the edges and not extrapolated beyond its first/last sample.
    None when the series has no point in or around the window."""
    t, v = _finite(series)
    if t.size == 0 or t1 <= t0:
        return None
    a, b = max(t0, t[0]), min(t1, t[-1])
    if b < a or (t.size == 1):
        return None
    inner = (t > a) & (t < b)
    tt = np.concatenate(([a], t[inner], [b]))
    vv = np.concatenate(([np.interp(a, t, v)], v[inner], [np.interp(b, t, v)]))
    return float(np.sum((tt[1:] - tt[:-1]) * (vv[1:] + vv[:-1]) / 2.0))


def counter_delta(series: Series, t0: float, t1: float) -> float | None:
    """Increase of a cumulative counter between t0 and t1 (interpolated); None without data."""
    t, v = _finite(series)
    if t.size < 2 or t1 < t[0] or t0 > t[-1]:
        return None
    return float(np.interp(min(t1, t[-1]), t, v) - np.interp(max(t0, t[0]), t, v))


def energy_per_token(power_w: Mapping[str, Series], levels: Sequence[LevelSpan], *,
                     tokens: Mapping[Any, float] | None = None, generation_counter: Series | None = None
                     ) -> dict[Any, float | None]:
    """J per output token for each level: ∫ Σ power dt ÷ tokens generated in the level.

    ``power_w``: GPU name → power series (W). Tokens come from ``tokens`` (level → output
    tokens, e.g. the load generator's count) or else from ``generation_counter``
    (``vllm:generation_tokens_total`` over time). None for a level without power data
    or without tokens.
    """
    out: dict[Any, float | None] = {}
    for level, t0, t1 in levels:
        joules = [integrate(s, t0, t1) for s in power_w.values()]
        joules = [j for j in joules if j is not None]
        n = tokens.get(level) if tokens is not None else (
            counter_delta(generation_counter, t0, t1) if generation_counter is not None else None)
        out[level] = sum(joules) / n if joules and n else None
    return out


@dataclass(frozen=True)
class ThrottleEvent:
    """A GPU started (or entered the level) limited by ``reasons`` at ``t`` (s)."""

    gpu: str
    t: float
    reasons: tuple[str, ...]
    at_level_start: bool = False


def throttle_events(masks: Mapping[str, Series], levels: Sequence[LevelSpan]) -> dict[Any, list[ThrottleEvent]]:
    """Level → throttle events on any GPU, in time order. ``masks``: GPU name →
    ``throttle_reasons`` series (NVML bitmask as float)."""
    out: dict[Any, list[ThrottleEvent]] = {level: [] for level, _, _ in levels}
    for gpu, s in masks.items():
        t, v = _finite(s)
        if t.size == 0:
            continue
        lim = np.array([throttle.limiting(int(x)) for x in v], dtype=np.int64)
        for level, t0, t1 in levels:
            before = np.nonzero(t <= t0)[0]  # the state the level starts in
            prev = int(lim[before[-1]]) if before.size else 0
            if prev:
                out[level].append(ThrottleEvent(gpu, float(t0), tuple(throttle.decode(prev)), True))
            for i in np.nonzero((t > t0) & (t < t1))[0]:
                cur = int(lim[i])
                if cur and cur & ~prev:
                    out[level].append(ThrottleEvent(gpu, float(t[i]), tuple(throttle.decode(cur))))
                prev = cur
    for evs in out.values():
        evs.sort(key=lambda e: (e.t, e.gpu))
    return out


def gpu_series(bank: Any, name: str, gpus: Iterable[str] | None = None) -> dict[str, Series]:
    """``{'gpu0': (t, v), …}`` of sample ``name`` from a :class:`SeriesBank`."""
    keys = [src for src, n in bank.keys() if n == name and src.startswith("gpu")]
    if gpus is not None:
        keys = [k for k in keys if k in set(gpus)]
    return {k: bank.get(k, name) for k in keys}


@dataclass(frozen=True)
class LevelEnergy:
    """A level's power and energy: ``power_w`` Σ over GPUs of the mean power in the
    level's window (W); ``j_per_token`` joules per output token (rig units for a sim)."""

    power_w: float | None
    j_per_token: float | None


def level_energy(power_w: Mapping[str, Series], window_start: float, window_end: float, output_tokens: float | None,
                 time_scale: float = 1.0) -> LevelEnergy:
    """The one definition of a level's power and J/token (the Results tab, History,
    ``compare`` and the tuner all call this).

    ``power_w``: GPU name → power series (W) on the session clock (wall seconds);
    ``window_start``/``window_end``: the level's steady-state window in rig seconds (=
    wall seconds unless a sim runs ``time_scale`` = k× faster than the wall clock);
    ``output_tokens``: output tokens generated in the window (``output_tps × window_s``).
    Per card, the mean power over the wall window [start/k, end/k] is ∫ P dt (trapezoid
    rule, :func:`integrate`) ÷ the part of the window its samples cover (the mean of its
    samples when they cover no span); ``power_w`` is their sum; J/token = power × rig
    window ÷ tokens (a rig k× slower than the sim's wall clock draws its power k× longer).
    For steady sampling this is ∫ Σ P dt ÷ tokens, and J/token = power ÷ output tokens/s."""
    k = time_scale or 1.0
    t0, t1 = window_start / k, window_end / k
    means = []
    for s in power_w.values():
        t, v = _finite(s)
        if t.size == 0 or t1 <= t0:
            continue
        a, b = max(t0, t[0]), min(t1, t[-1])
        j = integrate((t, v), t0, t1) if b > a else None
        if j is not None:
            means.append(j / (b - a))
        else:
            inside = v[(t >= t0) & (t <= t1)]
            if inside.size:
                means.append(float(inside.mean()))
    if not means:
        return LevelEnergy(None, None)
    power = sum(means)
    jpt = power * (window_end - window_start) / output_tokens if output_tokens else None
    return LevelEnergy(power, jpt)


def cost_per_mtok(output_tps: float | None, gpus: int, j_per_token: float | None,
                  pricing: Any) -> tuple[float | None, float | None]:
    """The one definition of cost per 10⁶ output tokens, as ``(rented, energy)`` in
    ``pricing``'s currency (an :class:`app.settings.Pricing`): rented = ``gpus ×
    gpu_hour ÷ (output_tps × 3600 s) × 10⁶``; energy = ``j_per_token × 10⁶ ÷ 3.6·10⁶ J/kWh
    × kwh`` (= price × kW ÷ tokens an hour). Each None when its price or figure is missing."""
    rented = energy = None
    if pricing.gpu_hour is not None and output_tps and output_tps > 0:
        rented = gpus * pricing.gpu_hour / (output_tps * 3600.0) * 1e6
    if pricing.kwh is not None and j_per_token is not None:
        energy = j_per_token * 1e6 / 3.6e6 * pricing.kwh
    return rented, energy


def power_series(samples: Iterable[tuple]) -> dict[str, Series]:
    """GPU power series from stored samples ``(t, source, name, value)`` (as
    ``RunStore.samples`` returns them): ``gpuN`` → (t, W) arrays; NULL values are gaps."""
    per: dict[str, tuple[list[float], list[float]]] = {}
    for t, src, name, v in samples:
        if name == names.POWER_W and src.startswith("gpu"):
            ts, vs = per.setdefault(src, ([], []))
            ts.append(t)
            vs.append(np.nan if v is None else v)
    return {src: (np.asarray(ts, dtype=float), np.asarray(vs, dtype=float)) for src, (ts, vs) in per.items()}
