"""Compare runs: "4 cards or 8? AWQ or FP8?".

For two or more recorded runs: the overlay curves (output throughput vs concurrency,
TTFT p99 vs throughput) and a table per run and level with

- tokens/s per GPU = output tokens/s ÷ GPUs used (TP × PP × DP of the run's config);
- scaling efficiency at the same level = (tps ÷ tps_base) ÷ (GPUs ÷ GPUs_base), the
  baseline being the run with the fewest GPUs (first given on a tie) — 8 cards vs 4
  cards is the throughput ratio ÷ 2; 1.0 is perfect scaling;
- power and J/token per level: :func:`app.telemetry.derived.level_energy` (the one
  definition: ∫ Σ P dt over the level's steady-state window ÷ its length, and ÷ the
  output tokens of the window);
- cost per million output tokens: rented = price per GPU-hour × GPUs ÷ (tps × 3600) ×
  10⁶; owned = electricity price per kWh × power (kW) ÷ (tps × 3600) × 10⁶ (1 kWh =
  3.6 MJ).

What differs between the runs (:func:`run_settings`, :func:`settings_diff`): the model,
the rig (engine, cards, vLLM version), the ``vllm serve`` flags and the request shape.
Runs of different models, request shapes, or CPU and GPU builds are not comparable
(:func:`comparability`): the comparison then says why and prints no scaling efficiency
(a 0.02 "efficiency" between a tiny model on a CPU and a 70B on eight GPUs means nothing).

Export: :meth:`Comparison.to_csv` and :meth:`Comparison.to_svg` (a dependency-free
vector chart for headless use); the GUI renders the same :meth:`Comparison.curves` to
PNG with pyqtgraph's exporter.
"""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from app.history import cards_text, get_run
from app.loadgen.stats import peak_level
from app.settings import Pricing
from app.telemetry import names
from app.telemetry.derived import cost_per_mtok, level_energy, power_series


@dataclass
class RunSeries:
    """One run's levels for comparing. ``gpus``: cards used; ``time_scale``: sim k (the
    level windows are in rig seconds, the power samples in wall seconds)."""

    run_id: int
    label: str
    gpus: int
    levels: list[dict[str, Any]]
    status: str = ""
    time_scale: float = 1.0
    power_w: dict[int, float | None] = field(default_factory=dict)  # level idx → W
    j_per_token: dict[int, float | None] = field(default_factory=dict)  # level idx → J/token
    users_at_slo: float | None = None  # the run's verdict (app.run.verdict), when it had an SLO
    verdict: str | None = None
    settings: dict[str, dict[str, str]] = field(default_factory=dict)  # run_settings(run)

    def peak(self) -> dict[str, Any] | None:
        """The peak level (:func:`app.loadgen.stats.peak_level`, the one definition)."""
        return peak_level(self.levels)


@dataclass
class CompareRow:
    """One run at one level. Units: tokens/s, s, W, J/token, currency per 10⁶ output
    tokens; None when not measurable (no power samples, no baseline level, no price)."""

    run_id: int
    label: str
    gpus: int
    level: float
    output_tps: float
    tps_per_gpu: float
    ttft_p99: float | None
    tpot_p99: float | None
    failure_rate: float
    scaling_efficiency: float | None
    power_w: float | None
    j_per_token: float | None
    cost_per_mtok_rented: float | None
    cost_per_mtok_energy: float | None

    COLUMNS = ("run_id", "label", "gpus", "level", "output_tps", "tps_per_gpu", "ttft_p99", "tpot_p99",
               "failure_rate", "scaling_efficiency", "power_w", "j_per_token", "cost_per_mtok_rented",
               "cost_per_mtok_energy")

    def values(self) -> list[Any]:
        return [getattr(self, c) for c in self.COLUMNS]


def gpus_of_run(run: dict[str, Any]) -> int:
    """GPUs a run used: summary ``gpu_count``, else TP × PP × DP of its config, else 1."""
    s = run.get("summary") or {}
    if s.get("gpu_count"):
        return int(s["gpu_count"])
    cfg = run.get("config") or {}
    server = cfg.get("server") or (cfg.get("profile") or {}).get("server") or {}
    n = 1
    for k in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
        v = server.get(k) or server.get(k.replace("_", "-"))
        n *= int(v or 1)
    return n


#: the sections of :func:`run_settings`, in the order a diff shows them
SETTING_SECTIONS = ("model", "rig", "flags", "request shape")
#: server fields shown elsewhere (model) or not a setting of the measurement (where it listens)
_NOT_FLAGS = {"model", "host", "port"}
#: ramp spec fields that make the request shape
_SHAPE_KEYS = ("prompt_tokens", "output_tokens", "shape", "endpoint", "prompts_file", "prompts_format", "output_cap",
               "ignore_eos")


def _text(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v))
    return str(v)


def run_settings(run: dict[str, Any]) -> dict[str, dict[str, str]]:
    """What a run measured, by :data:`SETTING_SECTIONS`, as text: the model; the rig
    (engine, cards × count, card memory, vLLM version); the ``vllm serve`` flags that
    were set (``env`` variables as ``env NAME``); the request shape of its ramp spec."""
    cfg = run.get("config") or {}
    prof = cfg.get("profile") or {}
    server = {k.replace("-", "_"): v for k, v in (cfg.get("server") or prof.get("server") or {}).items()}
    summ = run.get("summary") or {}
    hw = summ.get("hardware") or prof.get("hardware") or {}
    spec = run.get("spec") or {}
    model = server.get("model") or summ.get("model") or ""
    rig: dict[str, str] = {"engine": str(run.get("engine") or "")}
    if hw.get("gpu"):
        rig["cards"] = cards_text(hw)  # a rig of hosts: "2 hosts × 1× CPU (2 cores)"
    if hw.get("memory_gib"):
        rig["card memory"] = f"{float(hw['memory_gib']):.0f} GiB"
    if hw.get("vllm_version"):
        rig["vLLM"] = str(hw["vllm_version"])
    flags = {k: _text(v) for k, v in server.items() if k not in _NOT_FLAGS and k != "env" and v not in (None, "", [], {})}
    for k, v in sorted((server.get("env") or {}).items()):
        flags[f"env {k}"] = _text(v)
    shape = {k: _text(spec[k]) for k in _SHAPE_KEYS if spec.get(k) not in (None, "")}
    return {"model": {"model": str(model)} if model else {}, "rig": rig, "flags": flags, "request shape": shape}


def settings_diff(settings: Sequence[dict[str, dict[str, str]]]) -> list[tuple[str, str, list[str]]]:
    """The settings that differ between runs: (section, key, value per run — "—" where
    a run has none), by section in :data:`SETTING_SECTIONS` order."""
    out = []
    for sec in SETTING_SECTIONS:
        keys: list[str] = []
        for s in settings:
            keys += [k for k in s.get(sec, {}) if k not in keys]
        for k in keys:
            vals = [s.get(sec, {}).get(k, "—") for s in settings]
            if len(set(vals)) > 1:
                out.append((sec, k, vals))
    return out


def comparability(series: Sequence["RunSeries"]) -> list[str]:
    """Why these runs' throughputs cannot be set against each other (empty: they can):
    different models, different request shapes, or the CPU build beside GPUs. A run that
    did not record a setting (an attached server's model, say) is not held against it."""
    why = []

    def differ(sec: str, key: str) -> list[str] | None:
        vals = [s.settings.get(sec, {}).get(key, "—") for s in series]
        return vals if len({v for v in vals if v != "—"}) > 1 else None

    def listing(vals: list[str]) -> str:
        return ", ".join(f"{v} ({s.label.split(' ')[0]})" for s, v in zip(series, vals))

    if (m := differ("model", "model")) is not None:
        why.append(f"different models: {listing(m)}")
    for key in ("prompt_tokens", "output_tokens", "shape", "prompts_file", "endpoint"):
        if (v := differ("request shape", key)) is not None:
            why.append(f"different request shapes ({key}): {listing(v)}")
            break
    cpu = ["CPU" in s.settings["rig"]["cards"] for s in series if "cards" in s.settings.get("rig", {})]
    if any(cpu) and not all(cpu):
        why.append("the CPU build beside GPUs: "
                   + listing([s.settings.get("rig", {}).get("cards", "?") for s in series]))
    return why


def load_series(store, run_ids: Sequence[int], gpus: dict[int, int] | None = None) -> list[RunSeries]:
    """The runs to compare. ``gpus`` overrides a run's GPU count (run id → cards).
    Raises :class:`app.history.RunNotFound`."""
    out = []
    for rid in run_ids:
        r = get_run(store, rid)
        s = r.get("summary") or {}
        k = float(s.get("time_scale") or 1.0)
        n = (gpus or {}).get(rid) or gpus_of_run(r)
        v = s.get("verdict") or {}
        rs = RunSeries(rid, f"#{rid} {r['name']}", n, r["levels"], r["status"], k, users_at_slo=v.get("users"),
                       verdict=v.get("sentence"), settings=run_settings(r))
        power = power_series(store.samples(rid, name=names.POWER_W))
        for d in rs.levels:
            w0, w1 = d.get("window_start"), d.get("window_end")
            if w0 is None or w1 is None:
                rs.power_w[d["idx"]] = rs.j_per_token[d["idx"]] = None
                continue
            e = level_energy(power, w0, w1, (d.get("output_tps") or 0.0) * (w1 - w0), k)
            rs.power_w[d["idx"]], rs.j_per_token[d["idx"]] = e.power_w, e.j_per_token
        out.append(rs)
    return out


@dataclass
class Comparison:
    """The comparison of ``series`` (the baseline is ``series[baseline]``)."""

    series: list[RunSeries]
    pricing: Pricing = field(default_factory=Pricing)
    baseline: int = 0
    rows: list[CompareRow] = field(default_factory=list)
    #: why the runs are not comparable (:func:`comparability`; empty: they are)
    warnings: list[str] = field(default_factory=list)
    #: what differs between the runs (:func:`settings_diff`)
    diff: list[tuple[str, str, list[str]]] = field(default_factory=list)

    @property
    def comparable(self) -> bool:
        return not self.warnings

    def curves(self) -> dict[str, list[tuple[str, list[float], list[float]]]]:
        """Overlay data: ``throughput`` → (label, concurrency levels, output tokens/s);
        ``ttft`` → (label, output tokens/s, TTFT p99 s), one entry per run."""
        thr, ttft = [], []
        for s in self.series:
            lv = sorted(s.levels, key=lambda d: d["level"])
            thr.append((s.label, [d["level"] for d in lv], [d.get("output_tps") or 0.0 for d in lv]))
            pts = [(d.get("output_tps") or 0.0, d["ttft_p99"]) for d in lv if d.get("ttft_p99") is not None]
            ttft.append((s.label, [p[0] for p in pts], [p[1] for p in pts]))
        return {"throughput": thr, "ttft": ttft}

    def peak_rows(self) -> list[CompareRow]:
        """One row per run: its best level (highest throughput meeting the SLO), with the
        scaling efficiency of peak vs the baseline's peak."""
        base = self.series[self.baseline]
        bp = base.peak()
        out = []
        for s in self.series:
            p = s.peak()
            if p is None:
                continue
            row = _row(s, p, self.pricing, None)
            if bp is not None and bp.get("output_tps") and self.comparable:
                row.scaling_efficiency = (row.output_tps / bp["output_tps"]) / (s.gpus / base.gpus)
            out.append(row)
        return out

    def to_csv(self) -> str:
        """CSV of :attr:`rows` (columns :attr:`CompareRow.COLUMNS`)."""
        buf = io.StringIO()
        w = csv.writer(buf)
        w.writerow(CompareRow.COLUMNS)
        for r in self.rows:
            w.writerow(["" if v is None else (f"{v:.6g}" if isinstance(v, float) else v) for v in r.values()])
        return buf.getvalue()

    def to_svg(self, width: int = 960, height: int = 420) -> str:
        """Both overlays side by side as an SVG document (no plotting library)."""
        return curves_svg(self.curves(), width, height)


def _row(s: RunSeries, d: dict[str, Any], pricing: Pricing, eff: float | None) -> CompareRow:
    tps = d.get("output_tps") or 0.0
    pw = s.power_w.get(d["idx"])
    jpt = s.j_per_token.get(d["idx"])
    rented, energy = cost_per_mtok(tps, s.gpus, jpt, pricing)
    return CompareRow(s.run_id, s.label, s.gpus, d["level"], tps, tps / s.gpus, d.get("ttft_p99"), d.get("tpot_p99"),
                      d.get("failure_rate") or 0.0, eff, pw, jpt, rented, energy)


def compare(series: Sequence[RunSeries], pricing: Pricing | None = None, baseline: int | None = None) -> Comparison:
    """Build the comparison table. ``baseline``: index into ``series`` (default the run
    with the fewest GPUs, the first on a tie). Raises ValueError with fewer than 2 runs."""
    series = list(series)
    if len(series) < 2:
        raise ValueError("compare needs two or more runs: give at least two run ids (see `vllm-dyno runs list`)")
    if baseline is None:
        baseline = min(range(len(series)), key=lambda i: (series[i].gpus, i))
    base = series[baseline]
    base_tps = {d["level"]: d.get("output_tps") or 0.0 for d in base.levels}
    cmp = Comparison(series, pricing or Pricing(), baseline, warnings=comparability(series),
                     diff=settings_diff([s.settings for s in series]))
    for s in series:
        for d in sorted(s.levels, key=lambda x: x["level"]):
            b = base_tps.get(d["level"])
            tps = d.get("output_tps") or 0.0
            eff = (tps / b) / (s.gpus / base.gpus) if b and cmp.comparable else None
            cmp.rows.append(_row(s, d, cmp.pricing, eff))
    return cmp


def compare_runs(store, run_ids: Sequence[int], pricing: Pricing | None = None, gpus: dict[int, int] | None = None,
                 baseline: int | None = None) -> Comparison:
    """:func:`load_series` + :func:`compare`."""
    return compare(load_series(store, run_ids, gpus), pricing, baseline)


# ---------------------------------------------------------------------- SVG
_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def _panel(x0: float, y0: float, w: float, h: float, title: str, xl: str, yl: str,
           lines: list[tuple[str, list[float], list[float]]], logx: bool) -> list[str]:
    out = [f'<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#888"/>',
           f'<text x="{x0 + w / 2}" y="{y0 - 8}" text-anchor="middle" font-size="14">{_esc(title)}</text>',
           f'<text x="{x0 + w / 2}" y="{y0 + h + 32}" text-anchor="middle" font-size="12">{_esc(xl)}</text>',
           f'<text x="{x0 - 48}" y="{y0 + h / 2}" text-anchor="middle" font-size="12" '
           f'transform="rotate(-90 {x0 - 48} {y0 + h / 2})">{_esc(yl)}</text>']
    xs = [x for _, a, _ in lines for x in a if (x > 0 or not logx)]
    ys = [y for _, _, b in lines for y in b]
    if not xs or not ys:
        return out

    def fx(v: float) -> float:
        return math.log2(v) if logx else v

    lo, hi = fx(min(xs)), fx(max(xs))
    hi = hi if hi > lo else lo + 1
    ylo, yhi = 0.0, max(ys) * 1.1 or 1.0
    for i in range(5):
        yv = ylo + (yhi - ylo) * i / 4
        yy = y0 + h - h * i / 4
        out.append(f'<text x="{x0 - 4}" y="{yy + 4}" text-anchor="end" font-size="10">{yv:.3g}</text>')
    for v in sorted(set(xs)) if logx else [min(xs) + (max(xs) - min(xs)) * i / 4 for i in range(5)]:
        xx = x0 + w * (fx(v) - lo) / (hi - lo)
        out.append(f'<text x="{xx}" y="{y0 + h + 14}" text-anchor="middle" font-size="10">{v:.3g}</text>')
    for i, (label, a, b) in enumerate(lines):
        pts = [(x0 + w * (fx(x) - lo) / (hi - lo), y0 + h - h * (y - ylo) / (yhi - ylo))
               for x, y in zip(a, b) if x > 0 or not logx]
        if not pts:
            continue
        c = _COLORS[i % len(_COLORS)]
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="2" points="'
                   + " ".join(f"{px:.1f},{py:.1f}" for px, py in pts) + '"/>')
        out += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{c}"/>' for px, py in pts]
        out.append(f'<text x="{x0 + 8}" y="{y0 + 16 + 14 * i}" font-size="11" fill="{c}">{_esc(label)}</text>')
    return out


def curves_svg(curves: dict, width: int = 960, height: int = 420) -> str:
    """:meth:`Comparison.curves` (one run or several) as an SVG document: throughput vs
    concurrency (log2 x) and TTFT p99 vs throughput side by side, no plotting library."""
    pw, ph = (width - 180) / 2, height - 110
    body = _panel(70, 40, pw, ph, "Output throughput vs concurrency", "concurrency", "output tokens/s",
                  curves["throughput"], True)
    body += _panel(150 + pw, 40, pw, ph, "TTFT p99 vs throughput", "output tokens/s", "TTFT p99 (s)",
                   curves["ttft"], False)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif">\n<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(body)
            + "\n</svg>\n")
