"""A run, a comparison or a tune as one self-contained HTML file (issue 19, item 8).

A run (:func:`run_report`): the verdict, the flags as a
``vllm serve`` command and as ``--config`` YAML, the rig and versions, the per-level
table, the curves as inline SVG (:func:`app.comparison.curves_svg`, the same drawing as
``vllm-dyno compare --svg``) and a telemetry summary — no script, no external file, so it
opens offline in any browser and can be mailed or attached to an issue.

A comparison (:func:`compare_report`): the not-comparable warnings, what differs, each
run's verdict, the best levels, the overlaid curves and every level. A tune
(:func:`tune_report`, from ``vllm-dyno tune --json``'s result): the recommendation, the
runner-up and the starting flags with their commands, and every candidate predicted and
measured.

Rendered with Jinja2 (autoescaped, one base template; the SVG is the project's own, escaped where it holds
text). Every figure comes from the run store (:func:`app.history.get_run`,
``store.samples``): the report shows what ``vllm-dyno runs show ID`` shows.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from app import __version__, metrics
from app.comparison import Comparison, CompareRow, curves_svg, load_series, run_settings
from app.config import ServerConfig
from app.loadgen.server_stats import SERVER_COLUMNS, SERVER_LEGEND, explain, server_rows, server_summary
from app.profiles.interop import config_command, config_yaml
from app.telemetry import names

_env = Environment(loader=PackageLoader("app.report", "templates"), autoescape=select_autoescape(["html", "j2"]),
                   trim_blocks=True, lstrip_blocks=True)
_env.filters["g"] = lambda v: "–" if v is None else (f"{v:g}" if isinstance(v, (int, float)) else str(v))

@dataclass(frozen=True)
class TelemetryRow:
    """A row of the report's telemetry table: ``what`` it shows, the ``producer`` and
    ``series`` as the telemetry layer declares them (:data:`app.telemetry.names.PRODUCERS`:
    only that producer's sources are summarised — the cards' memory, not the host's), the
    display ``unit`` and ``scale`` (displayed = stored × scale: bytes → GiB, a fraction → %)."""

    what: str
    producer: str
    series: str
    unit: str
    scale: float = 1.0


#: the telemetry series summarised, in the table's order
TELEMETRY: tuple[TelemetryRow, ...] = (
    TelemetryRow("power", "gpu", names.POWER_W, "W"),
    TelemetryRow("GPU temperature", "gpu", names.TEMP_GPU_C, "°C"),
    TelemetryRow("memory used", "gpu", names.MEMORY_USED_BYTES, "GiB", 1 / 2**30),
    TelemetryRow("GPU utilisation", "gpu", names.UTIL_GPU_PCT, "%"),
    TelemetryRow("KV cache usage", "metrics", names.KV_CACHE_USAGE, "%", 100.0),
    TelemetryRow("running requests", "metrics", names.RUNNING, ""),
    TelemetryRow("waiting requests", "metrics", names.WAITING, ""),
)


def _server_config(run: dict[str, Any]) -> ServerConfig | None:
    cfg = run.get("config") or {}
    server = cfg.get("server")
    try:
        if server:
            return ServerConfig.model_validate(server)
        prof = (cfg.get("profile") or {}).get("server")
        return ServerConfig.from_vllm_config(prof) if prof else None
    except Exception:  # an old or hand-written run: the report says there is no config
        return None


def telemetry_summary(samples: list[tuple[float, str, str, float | None]]) -> list[dict[str, Any]]:
    """Per row of :data:`TELEMETRY` and source of its producer: samples, mean and max in
    the row's display unit (rows in the table's order, then by source; a gap — NULL —
    is not a value)."""
    rows = {(r.producer, r.series): r for r in TELEMETRY}
    groups: dict[tuple[int, str], list[float]] = {}
    order = {r: i for i, r in enumerate(TELEMETRY)}
    for _, source, name, value in samples:
        row = rows.get((names.producer_of(source) or "", name))
        if row is not None and value is not None and value == value:
            groups.setdefault((order[row], source), []).append(float(value))
    out = []
    for (i, source), vals in sorted(groups.items()):
        row = TELEMETRY[i]
        out.append({"series": row.what, "source": source, "unit": row.unit, "n": len(vals),
                    "mean": statistics.fmean(vals) * row.scale, "max": max(vals) * row.scale})
    return out


def run_report(store, run_id: int) -> str:
    """The HTML report of run ``run_id``. Raises :class:`app.history.RunNotFound`."""
    series = load_series(store, [run_id])[0]
    run = store.get_run(run_id)
    run["levels"] = series.levels
    summ = run.get("summary") or {}
    cfg = _server_config(run)
    version = (run.get("plan") or {}).get("vllm_version")  # the rules the run was planned with
    levels = sorted(series.levels, key=lambda d: (d.get("idx", 0)))
    slo = ((run.get("spec") or {}).get("slo") or {})
    # the per-level table (app.metrics, view REPORT); open loop: the level is the offered rate, the sent one beside it
    cols = [m for m in metrics.table_columns(metrics.REPORT, levels) if m.name != "slo_broken"]
    has_slo = any(v is not None for v in slo.values())
    rows = [{"cells": [m.cell(d) for m in cols],
             "slo": metrics.BY_NAME["slo_broken"].cell(d) if has_slo or d.get("slo_broken") else ""} for d in levels]
    headings = [m.heading for m in cols]
    if any(d.get("mode") == "rate" for d in levels):
        headings[0] = "offered req/s"
    settings = run_settings(run)
    with_server = [d for d in levels if d.get("server")]
    server = {"headings": SERVER_COLUMNS, "rows": server_rows(with_server), "legend": SERVER_LEGEND,
              "notes": [(f"{d['level']:g}", d["server"].get("notes") or explain(d)) for d in with_server],
              "said": server_summary(levels)}
    return _env.get_template("run.html.j2").render(
        server=server,
        run=run, summary=summ, verdict=(summ.get("verdict") or {}).get("sentence"),
        created=time.strftime("%Y-%m-%d %H:%M", time.localtime(run.get("created") or 0)),
        command=config_command(cfg, version) if cfg else None, config_yaml=config_yaml(cfg, version) if cfg else None,
        settings=settings, headings=headings, slo_heading=metrics.BY_NAME["slo_broken"].heading, rows=rows,
        slo={k: (f"{v * 100:g} %" if k == "failure_rate" else f"{v:g} s") for k, v in slo.items()
             if isinstance(v, (int, float))},
        svg=curves_svg(Comparison([series]).curves(), 960, 400) if levels else None,
        telemetry=telemetry_summary(store.samples(run_id)), knee=summ.get("knee"),
        capacity=run.get("capacity") or {}, version=__version__,
        generated=time.strftime("%Y-%m-%d %H:%M", time.localtime()))


#: the comparison tables: (heading, CompareRow attribute, format)
COMPARE_COLUMNS = (("run", "label", "{}"), ("GPUs", "gpus", "{:d}"), ("level", "level", "{:g}"),
                   ("out tok/s", "output_tps", "{:,.1f}"), ("tok/s per GPU", "tps_per_gpu", "{:,.1f}"),
                   ("TTFT p99 ms", "ttft_p99", "{:,.0f}"), ("TPOT p99 ms", "tpot_p99", "{:.1f}"),
                   ("scaling", "scaling_efficiency", "{:.2f}"), ("power W", "power_w", "{:,.0f}"),
                   ("J/token", "j_per_token", "{:.3f}"), ("per M tok (rent)", "cost_per_mtok_rented", "{:.3f}"),
                   ("per M tok (power)", "cost_per_mtok_energy", "{:.4f}"))


def _compare_cells(r: CompareRow) -> list[str]:
    out = []
    for _, attr, fmt in COMPARE_COLUMNS:
        v = getattr(r, attr)
        if v is None:
            out.append("–")
        elif attr in ("ttft_p99", "tpot_p99"):
            out.append(fmt.format(v * 1000))
        else:
            out.append(fmt.format(v))
    return out


def compare_report(cmp: Comparison) -> str:
    """The HTML report of a :class:`app.comparison.Comparison` (as ``vllm-dyno compare``
    prints it, with the curves)."""
    labels = [s.label for s in cmp.series]
    return _env.get_template("compare.html.j2").render(
        ids=", ".join(lab.split(" ")[0] for lab in labels), labels=labels, warnings=cmp.warnings, diff=cmp.diff,
        baseline=cmp.series[cmp.baseline].label, verdicts=[(s.label, s.verdict) for s in cmp.series if s.verdict],
        headings=[h for h, _, _ in COMPARE_COLUMNS], peaks=[_compare_cells(r) for r in cmp.peak_rows()],
        rows=[_compare_cells(r) for r in cmp.rows], svg=curves_svg(cmp.curves(), 960, 400), version=__version__,
        generated=time.strftime("%Y-%m-%d %H:%M", time.localtime()))


def tune_report(res: dict[str, Any], commands: dict[str, str] | None = None, name: str = "") -> str:
    """The HTML report of a tune's result (``vllm-dyno tune --json``'s mapping);
    ``commands``: the ``vllm serve`` line of ``recommendation``, ``runner_up`` and
    ``baseline`` where known."""
    commands = commands or {}
    cards = [(title, res.get(key), commands.get(key)) for title, key in
             (("Recommended", "recommendation"), ("Runner-up", "runner_up"), ("Your starting flags", "baseline"))]
    return _env.get_template("tune.html.j2").render(res=res, cards=cards, name=name, version=__version__,
                                                    generated=time.strftime("%Y-%m-%d %H:%M", time.localtime()))
