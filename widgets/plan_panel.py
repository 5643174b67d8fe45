"""The live plan next to the form: per-GPU memory bars, KV tokens and concurrency, the
predicted throughput and p99 latency curves of the Ramp tab's ramp with its SLO, the
predicted users at that SLO, and the verdict with each problem's sentence and an
**Apply fix** button. :class:`PlanRunner` re-plans (debounced, off the GUI thread) as the
user types; the planner itself is :func:`app.planner.plan.plan`.
"""
from __future__ import annotations

import html
import logging
import math
from dataclasses import dataclass
from typing import Any

import pyqtgraph as pg
from PySide6.QtCore import QObject, QRectF, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from app.engines import Engine
from app.planner.cards import cards_for
from app.planner.checks import weights_room_gib
from app.planner.models import resolve_model
from app.planner.pcie import read_host_pcie
from app.loadgen.capacity import P99_MIN_REQUESTS, fmt_users, slo_text
from app.planner.plan import Workload, fix_to_flags, plan_for
from app.planner.render import model_error_text, users_at_slo_text
from widgets.axes import Log2Axis, add_legend, log2, place_line
from widgets.fit import plot_view
from widgets.tasks import run_in_background

log = logging.getLogger(__name__)

#: memory segments: (label, colour)
#: "Held": memory not free before the launch — other processes' and the driver's reservation
SEGMENTS = [("Held (other processes, driver)", "#6b6b6b"), ("Weights", "#3b6fb6"), ("Activations", "#e8912d"),
            ("Non-torch", "#b08fc7"), ("KV cache", "#4aa564"), ("CUDA graphs", "#8e44ad"), ("Headroom", "#d9d9d9")]
VERDICT_STYLE = {"ok": ("#1e7b34", "#e3f4e6", "Fits — no problem found"),
                 "warn": ("#8a5a00", "#fff4d6", "Will run, with warnings"),
                 "error": ("#a61b1b", "#fde4e4", "Will not start as configured"),
                 "none": ("#555", "#eeeeee", "No plan")}
#: findings in the Plan tab: errors first, then warnings, then information (does not change the verdict)
FINDING_ORDER = {"error": 0, "warn": 1, "info": 2, "ok": 3}
FINDING_ICON = {"error": "⛔", "warn": "⚠", "info": "ℹ", "ok": "✓"}


@dataclass
class PlanInputs:
    """What a plan needs, captured on the GUI thread. ``readings``: NVML GpuReadings.
    ``ramp``: the Ramp tab's RampSpec — the plan predicts its levels, level shape,
    request lengths and users at its SLO (None: ``prompt_tokens``/``output_tokens``/
    ``levels`` with the default shape, no SLO). ``spec_acceptance``: the sim rig's
    ``--sim-spec-acceptance`` (a profile's ``sim: {spec_acceptance}``), so that the plan
    predicts what the sim will serve (None: the default)."""

    config: Any
    engine: Engine
    sim_gpu: str
    sim_count: int
    readings: list
    prompt_tokens: int
    output_tokens: int
    levels: tuple[int, ...] | None
    vllm_version: str | None
    ramp: Any = None
    spec_acceptance: float | None = None


def compute_plan(inp: PlanInputs):
    """Run the planner for ``inp`` (background thread). Returns the Plan; raises the
    planner's lookup errors (unknown model/GPU) and ValueError."""

    cfg = inp.config
    model = resolve_model(cfg.model)
    eng = Engine(inp.engine)
    sim = eng.simulated
    # the sim rig; else the selected cards' NVML readings; without readings the CPU build
    gpus = cards_for(engine=eng, gpu=inp.sim_gpu if sim else None, count=max(1, inp.sim_count) if sim else None,
                     readings=inp.readings or None, indices=cfg.gpus, cpu_build=not sim and not inp.readings)
    wl = Workload.from_ramp(inp.ramp) if inp.ramp is not None else Workload.of(inp.prompt_tokens,
                                                                                   inp.output_tokens, inp.levels)
    # the engine's vLLM rules and calibration (app.planner.plan.plan_for, as `vllm-dyno run` plans a profile):
    # a sim rig is planned as the sim plans it, its pinned rules and its (default) step-time parameters
    if sim:
        return plan_for(eng, cfg, gpus, model, wl, inp.vllm_version, spec_acceptance=inp.spec_acceptance)
    # this machine's IOMMU matters to its own cards only (not to a sim rig)
    host = read_host_pcie() if inp.readings else None
    try:
        return plan_for(eng, cfg, gpus, model, wl, inp.vllm_version, host=host)
    except ImportError:  # no calibration module in this build
        return plan_for(eng, cfg, gpus, model, wl, inp.vllm_version, use_calibration=False, host=host)


class PlanRunner(QObject):
    """Debounced re-planning: :meth:`request` with a zero-argument callable returning
    PlanInputs (or raising ValueError for a form error). Emits ``planned(plan)`` or
    ``failed(message, is_form_error)``; stale results are dropped."""

    planned = Signal(object)
    failed = Signal(str, bool)

    def __init__(self, parent: QObject | None = None, delay_ms: int = 150) -> None:
        super().__init__(parent)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(delay_ms)
        self._timer.timeout.connect(self._run)
        self._gen = 0
        self._inputs = None
        self.busy = False
        self.thread = None

    def request(self, inputs_fn) -> None:
        self._inputs = inputs_fn
        self._timer.start()

    def _run(self) -> None:
        self._gen += 1
        gen = self._gen
        try:
            inp = self._inputs()
        except ValueError as e:
            self.failed.emit(str(e), True)
            return
        self.busy = True

        def done(p):
            if gen == self._gen:
                self.busy = False
                self.planned.emit(p)

        def err(e):
            if gen == self._gen:
                self.busy = False
                self.failed.emit(str(e), isinstance(e, ValueError) and not isinstance(e, LookupError))

        self.thread = run_in_background("plan", lambda: compute_plan(inp), done, err)

    def stop(self) -> None:
        self._timer.stop()
        self._gen += 1


class MemoryBar(QWidget):
    """One card's memory as a stacked horizontal bar (GiB)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[tuple[str, str, float]] = []
        self.total = 1.0
        self.setMinimumHeight(22)
        self.setSizePolicy(QSizePolicy.Expanding, QSizePolicy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(300, 22)

    def set_parts(self, parts: list[tuple[str, str, float]], total: float) -> None:
        self.parts, self.total = parts, max(total, 1e-9)
        self.setToolTip("\n".join(f"{n}: {g:.2f} GiB" for n, _, g in parts if g > 0.005))
        self.update()

    def paintEvent(self, _ev) -> None:
        p = QPainter(self)
        r = self.rect().adjusted(0, 2, -1, -2)
        x = float(r.left())
        for name, color, gib in self.parts:
            w = r.width() * max(0.0, gib) / self.total
            if w <= 0:
                continue
            p.fillRect(QRectF(x, r.top(), w, r.height()), QColor(color))
            x += w
        p.setPen(QColor("#444"))
        p.drawRect(r)
        p.end()


def rank_parts(r) -> list[tuple[str, str, float]]:
    """Memory segments of a RankMemory, GiB, none negative; headroom = what is left of
    the card (0 when the parts overfill it: the bar is then scaled to their sum)."""
    busy = r.gpu.busy_gib
    vals = [max(0.0, v) for v in (busy, r.weights_gib, r.activation_gib, r.non_torch_gib, r.kv_gib,
                                  r.cuda_graphs_gib)]
    vals.append(max(0.0, r.total_gib - sum(vals)))
    return [(n, c, v) for (n, c), v in zip(SEGMENTS, vals)]


def rank_summary(p, r, parts: list[tuple[str, str, float]]) -> str:
    """The text beside a card's bar: weights, KV and headroom; "weights do not fit" with
    the per-card figure and the memory they may take (app.planner.checks.weights_room_gib)
    when they are larger."""
    d = {n: g for n, _, g in parts}
    room = weights_room_gib(p, r)
    if r.weights_gib > room + 1e-9:
        return (f"<small><b>weights do not fit</b>: {r.weights_gib:.1f} GiB per card, more than the "
                f"{room:.1f} GiB they may take</small>")
    draft = (f" (draft {r.draft_weights_gib:.2f})" if getattr(r, "draft_weights_gib", 0.0) > 0 else "")
    return (f"<small>weights {d['Weights']:.1f}{draft} · KV {d['KV cache']:.1f} · headroom {d['Headroom']:.1f} "
            "GiB</small>")


class PlanPanel(QScrollArea):
    """Shows a Plan. ``apply_fix(dict)`` when the user presses a finding's Apply fix."""

    apply_fix = Signal(object)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWidgetResizable(True)
        body = QWidget()
        self.setWidget(body)
        self.v = QVBoxLayout(body)
        self.verdict = QLabel()
        self.verdict.setObjectName("verdict")
        self.verdict.setWordWrap(True)
        self.v.addWidget(self.verdict)
        self.findings_box = QVBoxLayout()
        self.v.addLayout(self.findings_box)

        self.mem_title = QLabel("<b>Memory per GPU</b>")
        self.v.addWidget(self.mem_title)
        self.bars_box = QGridLayout()
        self.v.addLayout(self.bars_box)
        legend = QHBoxLayout()
        for name, color in SEGMENTS:
            sw = QLabel()
            sw.setFixedSize(12, 12)
            sw.setStyleSheet(f"background:{color}; border:1px solid #555;")
            legend.addWidget(sw)
            legend.addWidget(QLabel(name))
            legend.addSpacing(6)
        legend.addStretch(1)
        self.v.addLayout(legend)

        self.figures = QLabel()
        self.figures.setTextFormat(Qt.RichText)
        self.figures.setWordWrap(True)
        self.v.addWidget(self.figures)

        self.curve_plot = plot_view(pg.PlotWidget(axisItems={"bottom": Log2Axis("bottom")}))
        self.curve_plot.setMinimumHeight(220)
        pi = self.curve_plot.getPlotItem()
        pi.setTitle("Predicted throughput vs concurrency")
        pi.setLabel("bottom", "concurrent requests")
        pi.setLabel("left", "output tok/s")
        pi.showGrid(x=True, y=True, alpha=0.25)
        self.curve_item = pi.plot([], [], pen=pg.mkPen("#3b6fb6", width=2), symbol="o", symbolSize=5,
                                  symbolBrush="#3b6fb6")
        self.knee_line = pg.InfiniteLine(angle=90, pen=pg.mkPen("#a61b1b", style=Qt.DashLine),
                                         label="knee", labelOpts={"position": 0.9, "color": "#a61b1b"})
        pi.addItem(self.knee_line)
        self.knee_line.hide()
        self.v.addWidget(self.curve_plot)

        # the predicted p99s the SLO is judged on, with the Ramp tab's bounds
        self.lat_plot = plot_view(pg.PlotWidget(axisItems={"bottom": Log2Axis("bottom")}))
        self.lat_plot.setMinimumHeight(200)
        li = self.lat_plot.getPlotItem()
        li.setTitle("Predicted p99 latency vs concurrency")
        li.setLabel("bottom", "concurrent requests")
        li.setLabel("left", "ms")
        li.showGrid(x=True, y=True, alpha=0.25)
        add_legend(li, offset=(5, 5))
        self.ttft_item = li.plot([], [], pen=pg.mkPen("#e8912d", width=2), symbol="o", symbolSize=5,
                                 symbolBrush="#e8912d", name="TTFT p99")
        self.tpot_item = li.plot([], [], pen=pg.mkPen("#8e44ad", width=2), symbol="s", symbolSize=5,
                                 symbolBrush="#8e44ad", name="TPOT p99")
        self.slo_lines = {}
        for key, color in (("ttft_p99", "#e8912d"), ("tpot_p99", "#8e44ad")):
            ln = pg.InfiniteLine(angle=0, pen=pg.mkPen(color, style=Qt.DotLine),
                                 label=f"SLO {key.split('_')[0].upper()}",
                                 labelOpts={"position": 0.05, "color": color})
            li.addItem(ln)
            ln.hide()
            self.slo_lines[key] = ln
        self.v.addWidget(self.lat_plot)
        self.v.addStretch(1)
        self.plan = None
        self.show_message("Planning…", "none")

    # ------------------------------------------------------------------ display
    def _clear_layout(self, lay) -> None:
        while lay.count():
            it = lay.takeAt(0)
            w = it.widget()
            if w is not None:
                w.deleteLater()
            elif it.layout() is not None:
                self._clear_layout(it.layout())

    def _set_verdict(self, verdict: str, text: str) -> None:
        fg, bg, _ = VERDICT_STYLE[verdict]
        self.verdict.setStyleSheet(f"color:{fg}; background:{bg}; border:1px solid {fg}; border-radius:4px;"
                                   "padding:6px; font-weight:bold;")
        self.verdict.setText(text)

    def show_message(self, text: str, verdict: str = "none") -> None:
        """A verdict line without a plan (form error, unknown model, attach)."""
        self.plan = None
        self._set_verdict(verdict, text)
        self._clear_layout(self.findings_box)
        self._clear_layout(self.bars_box)
        self.figures.setText("")
        self.curve_item.setData([], [])
        self.knee_line.hide()
        self._show_latency(None)

    def set_measured(self, config, slo: dict, users: float, low: float, high: float) -> None:
        """The last Run ramp's verdict (a capacity search's users at the SLO and its
        interval) for server ``config`` at ``slo`` (rig s): the banner names it beside the
        prediction while the plan is of that configuration and SLO (issue 37: the banner,
        the verdict and History say the number to plan with)."""
        self.measured = (config, dict(slo), users, low, high)
        if self.plan is not None:
            self.show_plan(self.plan)

    def _measured_text(self, p) -> str:
        m = getattr(self, "measured", None)
        if m is None or p.capacity is None or m[0] != p.config or m[1] != p.capacity.slo:
            return ""
        _, _, users, low, high = m
        span = f" ({low:g}–{high:g})" if (low, high) != (users, users) else ""
        return f" · measured {fmt_users(users)}{span} by Run ramp"

    def show_plan(self, p) -> None:
        self.plan = p
        head = VERDICT_STYLE[p.verdict][2]
        users = p.predicted_users_at_slo
        at_slo = "" if users is None else (
            f" · predicted {fmt_users(users)} at {slo_text(p.capacity.slo)}" if users > 0
            else f" · not even 1 user is predicted to meet {slo_text(p.capacity.slo)}")
        at_slo += self._measured_text(p)
        self._set_verdict(p.verdict, f"{head} · vLLM {p.rules.version} rules{at_slo}")
        self._clear_layout(self.findings_box)

        for f in sorted(p.findings, key=lambda f: FINDING_ORDER.get(f.verdict, 3)):
            fr = QFrame()
            fr.setObjectName(f"finding_{f.problem}")
            fr.setFrameShape(QFrame.StyledPanel)
            h = QHBoxLayout(fr)
            h.setContentsMargins(6, 4, 6, 4)
            icon = FINDING_ICON.get(f.verdict, "•")
            lab = QLabel(f"{icon} <b>{f.problem}</b>: {html.escape(f.message, quote=False)}")
            lab.setWordWrap(True)
            lab.setTextInteractionFlags(Qt.TextSelectableByMouse)
            h.addWidget(lab, 1)
            if f.fix:
                b = QPushButton("Apply fix")
                b.setObjectName(f"fix_{f.problem}")
                b.setToolTip(f"Change the form: {fix_to_flags(f.fix)}" + "".join(
                    f"\n{'predicted' if i == 0 else 'next'}: {fix_to_flags(a)} ≈ {tps:,.0f} output tok/s"
                    for i, (a, tps) in enumerate(f.alternatives[:3])))
                b.clicked.connect(lambda _=False, fix=f.fix: self.apply_fix.emit(fix))
                h.addWidget(b)
            self.findings_box.addWidget(fr)

        self._clear_layout(self.bars_box)
        groups: list[tuple[list[int], Any]] = []
        for r in p.ranks:
            key = (r.gpu.name, round(r.total_gib, 2), round(r.gpu.busy_gib, 2), round(r.weights_gib, 3),
                   round(r.kv_gib, 3), r.stage)
            if groups and groups[-1][1][0] == key:
                groups[-1][0].append(r.rank)
            else:
                groups.append(([r.rank], (key, r)))
        for row, (ranks, (_, r)) in enumerate(groups[:16]):
            name = f"GPU {ranks[0]}" if len(ranks) == 1 else f"GPU {ranks[0]}–{ranks[-1]} (each)"
            lab = QLabel(f"{name}<br><small>{r.gpu.name}, {r.total_gib:.1f} GiB</small>")
            bar = MemoryBar()
            parts = rank_parts(r)
            bar.set_parts(parts, max(r.total_gib, sum(g for _, _, g in parts)))
            txt = QLabel(rank_summary(p, r, parts))
            self.bars_box.addWidget(lab, row, 0)
            self.bars_box.addWidget(bar, row, 1)
            self.bars_box.addWidget(txt, row, 2)
        self.bars_box.setColumnStretch(1, 1)

        e = p.effective
        lines = [f"KV cache: <b>{p.kv_cache_tokens:,}</b> tokens ({p.kv_bytes_per_token:,} B/token, "
                 f"block {e.block_size})",
                 f"Max concurrency at max_model_len {e.max_model_len:,}: <b>{p.max_concurrency:.1f}×</b>",
                 f"Weights: {p.weights_gib_total:.1f} GiB in total · TP {e.tp} × PP {e.pp}"
                 + (f" × DP {p.dp}" if p.dp > 1 else "") + f" · {e.dtype}"
                 + (f" · {e.quantization}" if e.quantization else "")
                 + f" · max_num_seqs {e.max_num_seqs} · max_num_batched_tokens {e.max_num_batched_tokens:,}"]
        if p.draft is not None:  # the speculative drafter's memory, counted in the bars' weights and KV
            last = p.ranks[-1]
            lines.append(f"Speculative decoding: {p.draft.method}, {p.draft.k} draft tokens a step · draft weights "
                         f"{last.draft_weights_gib:.2f} GiB and KV {last.draft_kv_bytes_per_token:,} B/token per card "
                         f"— {p.draft.note}")
        if p.workload is not None:
            n, why = p.concurrency_for(p.workload.prompt_tokens, p.workload.output_tokens)
            lines.append(f"Requests at once for {p.workload.prompt_tokens}+{p.workload.output_tokens} tokens: "
                         f"<b>{n}</b> (limited by {why})" + (f" on each of {p.dp} engines" if p.dp > 1 else ""))
        if p.curve is not None:
            best = max(p.curve.points, key=lambda q: q.output_tps)
            lines.append(f"Predicted knee: <b>{p.curve.knee}</b> concurrent ({p.curve.knee_reason}); peak "
                         f"≈ {best.output_tps:,.0f} output tok/s — the Ramp tab's ramp on the step-level engine "
                         "the sim runs")
            short = [q.concurrency for q in p.curve.points if not q.steady]
            if short:
                lines.append(f"<small>Levels {', '.join(map(str, short))}: the step is shorter than a request — "
                             "a start-up transient, as the ramp would measure it</small>")
        if p.capacity is not None:
            lines.append(f"Predicted users at SLO: <b>{html.escape(users_at_slo_text(p))}</b> "
                         f"<small>(a capacity search: ≥ {P99_MIN_REQUESTS} requests a level)</small>")
        elif p.curve is not None:
            lines.append("Predicted users at SLO: set a TTFT or TPOT p99 bound in the Ramp tab")
        err = model_error_text(p)
        if err:
            lines.append(f"<small>{html.escape(err[0].upper() + err[1:])}</small>")
        self.figures.setText("<br>".join(lines))
        if p.curve is not None:
            xs = [q.concurrency for q in p.curve.points]
            ys = [q.output_tps for q in p.curve.points]
            self.curve_item.setData(log2(xs), ys)
            place_line(self.knee_line, math.log2(max(1, p.curve.knee)), f"knee {p.curve.knee}")
        else:
            self.curve_item.setData([], [])
            self.knee_line.hide()
        self._show_latency(p)

    def _show_latency(self, p) -> None:
        """The predicted TTFT and TPOT p99 per level (ms; levels without a figure left
        out) and the SLO's bounds; empty without a curve."""
        curve = p.curve if p is not None else None
        for item, attr in ((self.ttft_item, "ttft_p99_s"), (self.tpot_item, "tpot_p99_s")):
            pts = [(q.concurrency, getattr(q, attr)) for q in (curve.points if curve else [])
                   if getattr(q, attr) is not None]
            item.setData(log2([x for x, _ in pts]) if pts else [], [y * 1e3 for _, y in pts])
        slo = (p.workload.slo if p is not None and p.workload is not None else None)
        for key, ln in self.slo_lines.items():
            bound = getattr(slo, key, None) if slo is not None else None
            if bound is None or curve is None:
                ln.hide()
            else:
                place_line(ln, bound * 1e3, f"SLO {key.split('_')[0].upper()} {bound * 1e3:g} ms")
