"""Calibration: fit the step-time model's parameters to a measured ramp and keep them
per hardware fingerprint under ``app.paths.calibration_dir()`` for later predictions.

The fit minimises the squared log-errors of the measured levels' output throughput
(and TTFT / TPOT where measured, at half weight) over the chosen parameters, in log
space, with a Nelder–Mead simplex (numpy only). Parameters are kept in plausible
bounds (η in 0.05–1, times in 1 µs–1 s).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import yaml

from app.fileio import read_yaml, write_atomic
from app.paths import calibration_dir
from app.planner.gpus import GpuSpec, RigLayout
from app.engine.steptime import PerfParams, StepTimeModel, predict_level

FIT_DEFAULT = ("eta_mem", "eta_compute", "t_cpu_s", "t_cpu_seq_s", "t_request_s")
_BOUNDS = {"eta_mem": (0.05, 1.0), "eta_compute": (0.01, 1.0), "t_cpu_s": (1e-6, 1.0),
           "t_cpu_seq_s": (1e-7, 0.1), "allreduce_alpha_s": (1e-6, 1e-2), "link_gbs": (0.5, 2000.0),
           "t_request_s": (1e-4, 5.0), "t_launch_layer_s": (1e-7, 1e-3)}


@dataclass(frozen=True)
class MeasuredLevel:
    """One measured ramp level: ``concurrency`` users, output tokens/s over the level's
    wall time, mean TTFT and TPOT in seconds (None when not measured)."""

    concurrency: int
    output_tps: float
    ttft_s: float | None = None
    tpot_s: float | None = None


@dataclass(frozen=True)
class LevelError:
    """Predicted vs measured at one level; errors in percent of the measured value."""

    concurrency: int
    predicted_tps: float
    measured_tps: float
    tps_error_pct: float
    predicted_ttft_s: float | None = None
    measured_ttft_s: float | None = None
    ttft_error_pct: float | None = None


def hardware_fingerprint(cards: Sequence[GpuSpec], rig: RigLayout | None = None) -> str:
    """A stable id for a set of cards: ``4x RTX 5090 31.8GiB`` (mixed cards joined by
    ``+``, in order). Memory to 0.1 GiB tells card variants apart. A rig of several
    hosts (``rig``) adds its layout and link: ``4x RTX 4090 23.5GiB @ 4 hosts x 1,
    ib-hdr200`` (its calibration holds the network's share too)."""
    groups: list[list] = []
    for g in cards:
        key = f"{g.name} {g.memory_gib:.1f}GiB"
        if groups and groups[-1][0] == key:
            groups[-1][1] += 1
        else:
            groups.append([key, 1])
    key = " + ".join(f"{n}x {k}" for k, n in groups)
    if rig is not None and rig.multi_host:
        key += f" @ {rig.hosts} hosts x {rig.cards_per_host}, {rig.link.name}"  # type: ignore[union-attr]
    return key


def _path(fingerprint: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9.+-]+", "_", fingerprint).strip("_") or "default"
    return calibration_dir() / f"{slug}.yaml"


def save_calibration(fingerprint: str, params: PerfParams, info: dict | None = None) -> Path:
    """Write the parameters for ``fingerprint`` (atomically: :func:`app.fileio.write_atomic`)."""
    p = _path(fingerprint)
    data = {"schema_version": 1, "fingerprint": fingerprint, "params": params.as_dict(), "info": info or {}}
    write_atomic(p, yaml.safe_dump(data, sort_keys=False))
    return p


def load_calibration(fingerprint: str) -> PerfParams | None:
    """The saved parameters for ``fingerprint``, or None (missing or unreadable file)."""
    p = _path(fingerprint)
    if not p.is_file():
        return None
    try:
        d = read_yaml(p)["params"]
        return PerfParams(**{k: d[k] for k in PerfParams.__dataclass_fields__ if k in d})
    except (OSError, ValueError, KeyError, TypeError):  # ValueError: app.fileio.YamlError
        return None


def level_errors(model: StepTimeModel, levels: Iterable[MeasuredLevel], prompt_tokens: int, output_tokens: int,
                 capacity: int) -> list[LevelError]:
    """Prediction vs measurement for each level (errors in % of the measurement)."""
    out = []
    for m in levels:
        pt = predict_level(model, m.concurrency, prompt_tokens, output_tokens, capacity)
        te = None
        if m.ttft_s:
            te = 100 * (pt.ttft_s - m.ttft_s) / m.ttft_s
        out.append(LevelError(m.concurrency, pt.output_tps, m.output_tps,
                              100 * (pt.output_tps - m.output_tps) / m.output_tps,
                              pt.ttft_s if m.ttft_s else None, m.ttft_s, te))
    return out


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, step: float = 0.5, iters: int = 600,
                tol: float = 1e-10) -> np.ndarray:
    """Minimise ``f`` from ``x0`` with the Nelder–Mead simplex (standard coefficients
    1, 2, 0.5, 0.5). Returns the best point."""
    n = len(x0)
    pts = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    vals = [f(p) for p in pts]
    for _ in range(iters):
        order = np.argsort(vals)
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        if abs(vals[-1] - vals[0]) < tol:
            break
        c = np.mean(pts[:-1], axis=0)
        xr = c + (c - pts[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = c + 2 * (c - pts[-1])
            fe = f(xe)
            pts[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = xr, fr
        else:
            xc = c + 0.5 * (pts[-1] - c)
            fc = f(xc)
            if fc < vals[-1]:
                pts[-1], vals[-1] = xc, fc
            else:
                pts = [pts[0]] + [pts[0] + 0.5 * (p - pts[0]) for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
    return pts[int(np.argmin(vals))]


@dataclass(frozen=True)
class MeasuredSet:
    """The measured levels of one server configuration for a joint fit: ``model`` its
    step-time model with its own default parameters (the factors multiply them),
    ``levels`` a closed-loop ramp or search of ``prompt_tokens``/``output_tokens``
    requests, ``capacity`` the requests one engine runs at once (max_num_seqs or the KV
    limit), ``engines`` its data parallel replicas (users spread evenly over them)."""

    model: StepTimeModel
    levels: tuple[MeasuredLevel, ...]
    prompt_tokens: int
    output_tokens: int
    capacity: int
    engines: int = 1


#: weight of the pull of every log-factor towards 0 (factor 1) in :func:`fit_factors`:
#: a term the measurements do not determine (the all-reduce of a TP 1 server, the
#: prefill of a decode-bound ramp) stays at its default instead of drifting
PRIOR_WEIGHT = 0.02


def _bounded(name: str, v: float) -> float:
    lo, hi = _BOUNDS.get(name, (1e-9, 1e9))
    return float(min(hi, max(lo, v)))


def apply_factors(params: PerfParams, factors: dict[str, float], source: str | None = None) -> PerfParams:
    """``params`` with each named term multiplied by its factor (kept in the plausible
    bounds); the rest unchanged."""
    vals = {n: _bounded(n, getattr(params, n) * f) for n, f in factors.items()}
    return replace(params, **vals, **({"source": source} if source else {}))


def spread_level(model: StepTimeModel, users: int, engines: int, prompt_tokens: int, output_tokens: int,
                 capacity: int) -> tuple[float, float, float]:
    """One closed-loop level of ``users`` spread evenly over ``engines`` data parallel
    replicas (N mod D of them get one user more; an engine without users is idle), by
    :func:`app.engine.steptime.predict_level` per engine: (output tokens/s of all,
    TTFT and TPOT averaged over the users, s)."""
    base, extra = divmod(max(1, users), max(1, engines))
    tps = ttft = tpot = 0.0
    for n, k in ((base + 1, extra), (base, engines - extra)):
        if n <= 0 or k <= 0:
            continue
        pt = predict_level(model, n, prompt_tokens, output_tokens, capacity)
        tps += k * pt.output_tps
        ttft += k * n * pt.ttft_s
        tpot += k * n * pt.tpot_s
    n_all = max(1, users)
    return tps, ttft / n_all, tpot / n_all


def fit_factors(sets: Sequence[MeasuredSet], names: Sequence[str] = FIT_DEFAULT,
                prior_weight: float = PRIOR_WEIGHT, ttft_weight: float = 0.5, tpot_weight: float = 0.5,
                min_levels: int = 2) -> dict[str, float]:
    """One factor per parameter in ``names``, shared by every configuration in ``sets``
    (each configuration's parameters = its own defaults × the factors: the rig's
    efficiencies and overheads, whatever the split or the flags), fitted to all their
    measured levels at once: squared log-errors of output tokens/s (and TTFT / TPOT at
    ``ttft_weight`` / ``tpot_weight``, where measured) of
    :func:`app.engine.steptime.predict_level`, plus
    ``prior_weight`` × Σ log(factor)² (unidentified terms stay at 1). Nelder–Mead in
    log space, restarted once. Raises ValueError with fewer than ``min_levels`` levels
    in all (one level — a single ``vllm bench serve`` result — leans on the prior for
    the terms it cannot tell apart)."""
    if sum(len(s.levels) for s in sets) < max(1, min_levels):
        raise ValueError("calibration needs at least 2 measured levels of a ramp")
    multi_card = any(s.model.tp > 1 for s in sets)
    names = [n for n in names if not (n in ("allreduce_alpha_s", "link_gbs") and not multi_card)]

    def factors_of(x: np.ndarray) -> dict[str, float]:
        return {n: float(f) for n, f in zip(names, np.exp(x))}

    def loss(x: np.ndarray) -> float:
        f = factors_of(x)
        s = prior_weight * float(np.sum(x ** 2))
        for ms in sets:
            m = ms.model.with_params(apply_factors(ms.model.params, f))
            for lv in ms.levels:
                tps, ttft, tpot = spread_level(m, lv.concurrency, ms.engines, ms.prompt_tokens, ms.output_tokens,
                                               ms.capacity)
                s += math.log(tps / lv.output_tps) ** 2
                if lv.ttft_s and ttft_weight:
                    s += ttft_weight * math.log(ttft / lv.ttft_s) ** 2
                if lv.tpot_s and tpot_weight:
                    s += tpot_weight * math.log(tpot / lv.tpot_s) ** 2
        return s

    best = nelder_mead(loss, np.zeros(len(names)))
    best = nelder_mead(loss, best, step=0.2)  # restart: the simplex may have collapsed early
    return factors_of(best)


def fit(model: StepTimeModel, levels: Sequence[MeasuredLevel], prompt_tokens: int, output_tokens: int,
        capacity: int, names: Sequence[str] = FIT_DEFAULT) -> PerfParams:
    """Parameters of ``model`` (those in ``names``) fitted to the measured ``levels`` of
    a closed-loop ramp with this workload; ``capacity`` = requests the engine runs at
    once (max_num_seqs or the KV limit): :func:`fit_factors` of that one configuration
    without the prior. Raises ValueError with fewer than 2 levels."""
    if len(levels) < 2:
        raise ValueError("calibration needs at least 2 measured levels of a ramp")
    f = fit_factors([MeasuredSet(model, tuple(levels), prompt_tokens, output_tokens, capacity)], names,
                    prior_weight=0.0)
    return apply_factors(model.params, f, source=f"calibrated on {len(levels)} levels")


def calibrate_and_save(model: StepTimeModel, cards: Sequence[GpuSpec], levels: Sequence[MeasuredLevel],
                       prompt_tokens: int, output_tokens: int, capacity: int) -> tuple[PerfParams, Path]:
    """:func:`fit`, then save under the cards' fingerprint; returns (params, file)."""
    params = fit(model, levels, prompt_tokens, output_tokens, capacity)
    errs = level_errors(model.with_params(params), levels, prompt_tokens, output_tokens, capacity)
    info = {"prompt_tokens": prompt_tokens, "output_tokens": output_tokens, "capacity": capacity,
            "levels": [e.__dict__ for e in errs]}
    return params, save_calibration(hardware_fingerprint(cards), params, info)
