"""The Tune tab (issue 18, item 5): the search space as check boxes with the planner's
reason next to every pruned value, the SLO, workload, objective and budget, Start /
Stop; live progress, the candidates filling in, the Pareto plot, the result card and
the exports.

Presentation only: the space, the pruning, the spec, the tune, the Pareto points, the
progress line and the exports are :mod:`app.tuner` (:mod:`app.tuner.report`). The tune
runs on a background thread through the window's run controller (so the Live tab
follows every launch); its progress (:class:`app.tuner.tune.TuneListener`) comes back
as a Qt signal on the GUI thread.
"""
from __future__ import annotations

import html
import logging
import threading
import time
from typing import Any, Callable

import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QColor, QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.loadgen.spec import SLO
from app.tuner import report
from app.tuner.tune import OBJECTIVES, TuneAborted, Tuner, TuneListener
from widgets.axes import LegendFit, LegendPlace, add_legend
from widgets.fit import FormScrollArea, plot_view
from widgets.flow_layout import FlowLayout
from widgets.tasks import run_in_background

log = logging.getLogger(__name__)

#: the objective's words in the combo box
OBJECTIVE_TEXT = {"users": "most users at the SLO", "throughput": "most output tok/s at the SLO",
                  "cost": "lowest $/M tokens at the SLO", "energy": "lowest J/token at the SLO"}
#: the candidate table's columns
COLUMNS = ["Configuration", "Cards", "Predicted users", "Measured users", "Status"]
CARD_STYLE = ("QFrame#tuneCard { background:#f4f8fc; border:1px solid #9db7d5; border-radius:4px; }"
              "QFrame#tuneCard[rec=\"true\"] { background:#e8f1fb; border:2px solid #2f6db5; }")
PRUNED_STYLE = "color:#8a1c1c;"
START_TIP = "Launch the best predicted configurations one by one, measure, re-rank, confirm"


class _ToQt(TuneListener):
    """The tuner's progress (its thread) → the panel's signal (GUI thread), with the
    result dict computed on the tuner's thread."""

    def __init__(self, panel: "TunePanel") -> None:
        self.panel = panel
        self.tuner: Tuner | None = None

    def on_progress(self, state, message: str) -> None:
        if self.tuner is None:
            return
        res = self.tuner.result()
        self.panel.progressed.emit(res, message)


class TunePanel(QWidget):
    """``start_fn() → app.tuner.report.TuneStart`` (the window's forms; raises ValueError
    naming the field), ``controller_fn()`` the window's :class:`app.run.controller.RunController`,
    ``store_fn()`` the run store, ``pricing_fn()`` Settings' prices; ``confirm_fn(start) →
    TuneStart | None`` asks the user before a tune's launches bind beyond loopback (over a
    profile's hosts the head does: its ``expose`` set) — None: not confirmed, no tune.

    Signals: ``running_changed(bool)`` when a tune starts or ends; ``progressed(dict,
    str)`` (internal: the tuner's result so far and its message); ``profile_saved(str)``;
    ``launch_requested(Profile)`` and ``verify_requested(Profile, RampSpec)``: the
    recommendation to launch, or to launch and search (the window's launch and ramp paths)."""

    running_changed = Signal(bool)
    progressed = Signal(object, str)
    profile_saved = Signal(str)
    launch_requested = Signal(object)  # the recommendation as a Profile
    verify_requested = Signal(object, object)  # the Profile and the RampSpec of its capacity search

    def __init__(self, start_fn: Callable[[], Any], controller_fn: Callable[[], Any], store_fn: Callable[[], Any],
                 pricing_fn: Callable[[], Any] | None = None, now_fn: Callable[[], float] = time.monotonic,
                 block_fn: Callable[[], str | None] | None = None, parent: QWidget | None = None,
                 confirm_fn: Callable[[Any], Any] | None = None) -> None:
        super().__init__(parent)
        self.confirm_fn = confirm_fn or (lambda start: start)
        self.block_fn = block_fn or (lambda: None)  # why a tune cannot start now (the window's server runs)
        self._blocked: str | None = None  # what set_blocked last said
        self.start_fn, self.controller_fn, self.store_fn = start_fn, controller_fn, store_fn
        self.pricing_fn = pricing_fn or (lambda: None)
        self.now_fn = now_fn
        self.tuner: Tuner | None = None
        self.tuned_spec: Any = None  # the TuneSpec of the last tune started
        self.thread: threading.Thread | None = None
        self.res: dict[str, Any] | None = None  # the tune's (or the dry run's) result shown
        self.start: Any = None  # the TuneStart the result belongs to
        self.status: dict[str, dict[Any, str | None]] = {}
        self.boxes: dict[str, dict[Any, QCheckBox]] = {}
        self.reasons: dict[str, dict[Any, QLabel]] = {}
        self.models: dict[str, str] = {}  # checkpoint label → model id
        self.clock: report.ProgressClock | None = None
        self._stop_asked = False
        self._stale = True
        self._gen = 0  # population generation: a late answer of an older one is dropped
        self.background: list[threading.Thread] = []
        self.progressed.connect(self._on_progress, Qt.QueuedConnection)

        split = QSplitter(Qt.Horizontal, self)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(2, 2, 2, 2)
        outer.addWidget(split)
        split.addWidget(self._build_left())
        split.addWidget(self._build_right())
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 1)
        split.setSizes([390, 760])
        self.splitter = split
        self.timer = QTimer(self)
        self.timer.setInterval(1000)
        self.timer.timeout.connect(self._tick)
        self.replan_timer = QTimer(self)  # form edits come in bursts: plan once they settle
        self.replan_timer.setSingleShot(True)
        self.replan_timer.setInterval(800)
        self.replan_timer.timeout.connect(self.refresh_space)
        self._set_running(False)

    # ------------------------------------------------------------------ building
    def _build_left(self) -> QWidget:
        w = QWidget()
        v = QVBoxLayout(w)
        v.setContentsMargins(4, 4, 4, 4)
        g = QGroupBox("Search space (the planner prunes what cannot start)")
        gv = QVBoxLayout(g)
        self.space_status = QLabel("Open this tab to plan the space of the form's configuration.")
        self.space_status.setWordWrap(True)
        gv.addWidget(self.space_status)
        self.space_box = QVBoxLayout()
        self.space_box.setSpacing(2)
        gv.addLayout(self.space_box)
        row = QHBoxLayout()
        self.checkpoints = QLineEdit()
        self.checkpoints.setPlaceholderText("awq=…-AWQ-INT4, fp8=…-FP8")
        self.checkpoints.setToolTip("Other checkpoints of the model, one per quantization (QUANT=MODEL, comma "
                                    "separated); empty: the form's model only")
        self.checkpoints.editingFinished.connect(self.refresh_space)
        row.addWidget(QLabel("Checkpoints"))
        row.addWidget(self.checkpoints, 1)
        gv.addLayout(row)
        self.refresh_btn = QPushButton("Re-plan the space")
        self.refresh_btn.setToolTip("Enumerate the space of the form's configuration again and predict it")
        self.refresh_btn.clicked.connect(self.refresh_space)
        gv.addWidget(self.refresh_btn)
        v.addWidget(g)

        g = QGroupBox("SLO, workload, objective, budget")
        f = QFormLayout(g)
        self.slo_ttft = QDoubleSpinBox()
        self.slo_ttft.setRange(0, 600000)
        self.slo_ttft.setDecimals(0)
        self.slo_ttft.setSuffix(" ms")
        self.slo_ttft.setSpecialValueText("none")
        self.slo_ttft.setToolTip("TTFT p99 bound (0: none)")
        f.addRow("TTFT p99 ≤", self.slo_ttft)
        self.slo_tpot = QDoubleSpinBox()
        self.slo_tpot.setRange(0, 60000)
        self.slo_tpot.setDecimals(0)
        self.slo_tpot.setSuffix(" ms")
        self.slo_tpot.setSpecialValueText("none")
        self.slo_tpot.setToolTip("TPOT p99 bound, per output token (0: none)")
        f.addRow("TPOT p99 ≤", self.slo_tpot)
        self.prompt_tokens = QSpinBox()
        self.prompt_tokens.setRange(1, 1_000_000)
        self.prompt_tokens.setValue(report.DEFAULT_PROMPT_TOKENS)
        self.prompt_tokens.setSuffix(" tokens")
        f.addRow("Prompt", self.prompt_tokens)
        self.output_tokens = QSpinBox()
        self.output_tokens.setRange(1, 1_000_000)
        self.output_tokens.setValue(report.DEFAULT_OUTPUT_TOKENS)
        self.output_tokens.setSuffix(" tokens")
        f.addRow("Output", self.output_tokens)
        self.objective = QComboBox()
        for o in OBJECTIVES:
            self.objective.addItem(OBJECTIVE_TEXT[o], o)
        f.addRow("Objective", self.objective)
        self.max_launches = QSpinBox()
        self.max_launches.setRange(1, 100)
        self.max_launches.setValue(4)
        self.max_launches.setToolTip("Server launches, the confirming one included")
        f.addRow("Max launches", self.max_launches)
        self.max_minutes = QDoubleSpinBox()
        self.max_minutes.setRange(0, 10000)
        self.max_minutes.setDecimals(0)
        self.max_minutes.setSuffix(" min")
        self.max_minutes.setSpecialValueText("no limit")
        self.max_minutes.setToolTip("Stop launching after this many minutes of wall time (0: no limit)")
        f.addRow("Max minutes", self.max_minutes)
        v.addWidget(g)

        v.addStretch(1)
        sc = FormScrollArea()
        sc.setWidget(w)
        sc.setFrameShape(QFrame.NoFrame)
        outer = QWidget()
        ov = QVBoxLayout(outer)
        ov.setContentsMargins(0, 0, 0, 0)
        ov.addWidget(sc, 1)
        row = QHBoxLayout()
        row.setContentsMargins(4, 2, 4, 4)
        self.start_btn = QPushButton("Start tune")
        self.start_btn.setToolTip(START_TIP)
        self.start_btn.clicked.connect(self.start_tune)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setToolTip("Stop the tune: the running search is aborted and the server stopped; the tune is "
                                 "saved (resume with `vllm-dyno tune --resume ID`)")
        self.stop_btn.clicked.connect(self.stop_tune)
        row.addWidget(self.start_btn)
        row.addWidget(self.stop_btn)
        ov.addLayout(row)
        outer.setMinimumWidth(340)
        return outer

    def _build_right(self) -> QWidget:
        w = QWidget()
        v = QVBoxLayout(w)
        v.setContentsMargins(4, 4, 4, 4)
        self.progress = QLabel("No tune yet.")
        self.progress.setWordWrap(True)
        self.progress.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.progress.setStyleSheet("font-weight:600;")
        v.addWidget(self.progress)
        self.bar = QProgressBar()
        self.bar.setFormat("launch %v of ≤ %m")
        self.bar.setMaximumHeight(16)
        self.message = QLabel("")
        self.message.setWordWrap(True)
        self.message.setStyleSheet("color:#444;")
        v.addWidget(self.bar)
        v.addWidget(self.message)

        split = QSplitter(Qt.Vertical)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeToContents)
        hh.setSectionResizeMode(len(COLUMNS) - 1, QHeaderView.Stretch)  # the reasons: elided, whole in the tooltip
        self.table.setTextElideMode(Qt.ElideRight)
        self.table.setWordWrap(False)
        split.addWidget(self.table)

        self.plot = plot_view(pg.PlotWidget(background="w"))
        pi = self.plot.getPlotItem()
        pi.setTitle("Pareto: output tok/s per user vs per GPU", size="10pt")
        pi.setLabel("bottom", "output tok/s per user")
        pi.setLabel("left", "output tok/s per GPU")
        pi.showGrid(x=True, y=True, alpha=0.25)
        # bottom left: slow streams at low throughput per GPU — the corner no configuration reaches
        self.legend = add_legend(pi, offset=(6, -6), labelTextSize="8pt", brush=pg.mkBrush(255, 255, 255, 230),
                                   pen=pg.mkPen("#bbb"))
        # short names keep the key within a quarter of the plot (issue 19, item 9); it shrinks
        # its labels (then hides) when the plot is smaller than that (widgets.axes.LegendFit)
        self.legend_fit = LegendFit(pi, self.legend, drive=True)
        self.legend_place = LegendPlace(pi, self.legend)  # the corner that covers the fewest points
        self.pred_pts = pg.ScatterPlotItem(size=8, pen=pg.mkPen("#7a8ea6", width=1.2), brush=None, symbol="o",
                                           name="predicted")
        self.met_pts = pg.ScatterPlotItem(size=8, pen=None, brush=pg.mkBrush("#2f6db5"), symbol="o",
                                          name="measured, met SLO")
        self.broke_pts = pg.ScatterPlotItem(size=8, pen=pg.mkPen("#b0413e", width=1.5), brush=None, symbol="x",
                                            name="measured, broke SLO")
        self.front = pg.PlotDataItem(pen=pg.mkPen("#2f6db5", width=1.5, style=Qt.DashLine), name="Pareto front")
        self.rec_pt = pg.ScatterPlotItem(size=18, pen=pg.mkPen("#7a4a00", width=1.5), brush=pg.mkBrush("#f0a202"),
                                         symbol="star", name="recommended")
        for it in (self.pred_pts, self.met_pts, self.broke_pts, self.front, self.rec_pt):
            pi.addItem(it)
        # the SLO's bound: slower streams than 1 / TPOT p99 break it (shaded), named in the legend
        slo_pen = pg.mkPen("#b0413e", width=1.5, style=Qt.DotLine)
        self.slo_line = pg.InfiniteLine(angle=90, movable=False, pen=slo_pen)
        self.slo_shade = pg.LinearRegionItem(orientation="vertical", movable=False,
                                             brush=pg.mkBrush(176, 65, 62, 22), pen=pg.mkPen(None))
        self.slo_key = pg.PlotDataItem(pen=slo_pen, name="SLO bound")
        for it in (self.slo_shade, self.slo_line):
            it.hide()
            pi.addItem(it)
        pi.addItem(self.slo_key)  # no data: only its legend entry (a hidden item's entry is drawn crossed out)
        self.slo_shade.setZValue(-10)
        split.addWidget(self.plot)

        card = QWidget()
        cv = QVBoxLayout(card)
        cv.setContentsMargins(0, 0, 0, 0)
        self.cards_row = QHBoxLayout()
        self.card_labels: list[tuple[QFrame, QLabel]] = []
        for i in range(3):
            fr = QFrame()
            fr.setObjectName("tuneCard")
            fr.setProperty("rec", "true" if i == 0 else "false")
            fr.setStyleSheet(CARD_STYLE)
            fl = QVBoxLayout(fr)
            fl.setContentsMargins(6, 4, 6, 4)
            lab = QLabel()
            lab.setWordWrap(True)
            lab.setTextFormat(Qt.RichText)
            lab.setTextInteractionFlags(Qt.TextSelectableByMouse)
            lab.setAlignment(Qt.AlignTop | Qt.AlignLeft)
            fl.addWidget(lab)
            fr.hide()
            self.cards_row.addWidget(fr, 1)
            self.card_labels.append((fr, lab))
        cv.addLayout(self.cards_row)
        self.sentence = QLabel("")
        self.sentence.setWordWrap(True)
        self.sentence.setTextInteractionFlags(Qt.TextSelectableByMouse)
        cv.addWidget(self.sentence)
        row = FlowLayout()  # wraps at a laptop's width (issue 37, item 7)
        self.save_btn = QPushButton("Save as profile…")
        self.save_btn.setToolTip("Save the recommended flags as a profile (this profile's rig and ramp)")
        self.save_btn.clicked.connect(self.save_profile_dialog)
        self.copy_btn = QPushButton("Copy vllm serve command")
        self.copy_btn.clicked.connect(self.copy_command)
        self.export_btn = QPushButton("Export --config YAML…")
        self.export_btn.setToolTip("Write the recommended flags as a vLLM --config file")
        self.export_btn.clicked.connect(self.export_dialog)
        self.launch_btn = QPushButton("Launch recommended")
        self.launch_btn.setToolTip("Launch the recommended configuration on this rig (the forms show it, unsaved)")
        self.launch_btn.clicked.connect(self.launch_recommended)
        self.verify_btn = QPushButton("Verify (find capacity)")
        self.verify_btn.setToolTip("Launch the recommendation and search its capacity from the users the tune "
                                   "measured, with the tune's SLO and requests")
        self.verify_btn.clicked.connect(self.verify_recommended)
        for b in (self.launch_btn, self.verify_btn, self.save_btn, self.copy_btn, self.export_btn):
            row.addWidget(b)
        cv.addLayout(row)
        split.addWidget(card)
        split.setSizes([210, 310, 300])
        split.setChildrenCollapsible(False)
        v.addWidget(split, 1)
        return w

    # ------------------------------------------------------------------ state
    @property
    def running(self) -> bool:
        """A tune runs until its end has been shown here: its thread may have finished
        while its result (or its TuneAborted) still waits on the GUI thread's queue."""
        return self.thread is not None and (self.thread.is_alive() or self.tuner is not None)

    def set_blocked(self, reason: str | None) -> None:
        """Start is disabled, with ``reason`` as its tooltip, while a tune cannot start."""
        self._blocked = reason
        self.start_btn.setEnabled(reason is None and not self.running)
        self.start_btn.setToolTip(reason or START_TIP)

    def _set_running(self, on: bool) -> None:
        self.start_btn.setEnabled(not on and self._blocked is None)
        self.stop_btn.setEnabled(on)
        self.refresh_btn.setEnabled(not on)
        self.checkpoints.setEnabled(not on)
        rec = (self.res or {}).get("recommendation") if not on else None
        for b in (self.save_btn, self.copy_btn, self.export_btn):
            b.setEnabled(rec is not None)
        for b in (self.launch_btn, self.verify_btn):  # what was measured: a tune's, not a dry run's
            b.setEnabled(rec is not None and rec.get("measured", True) and self.tuned_spec is not None)
        if on:
            self.timer.start()
        else:
            self.timer.stop()

    def mark_stale(self) -> None:
        """The form changed: the space is planned again when the tab is shown (not while a
        tune runs: it tunes the configuration it started with)."""
        self._stale = True
        if self.isVisible() and not self.running:
            self.replan_timer.start()

    def showEvent(self, ev) -> None:
        super().showEvent(ev)
        if self._stale and not self.running:
            self.refresh_space()

    def set_defaults(self, start: Any) -> None:
        """The SLO and lengths of ``start``'s ramp (a profile loaded) as the defaults."""
        pt, ot, _spread, _seed = report.workload_from_ramp(start.ramp)
        self.prompt_tokens.setValue(pt)
        self.output_tokens.setValue(ot)
        slo = start.ramp.slo if start.ramp is not None else SLO()
        self.slo_ttft.setValue((slo.ttft_p99 or 0) * 1000)
        self.slo_tpot.setValue((slo.tpot_p99 or 0) * 1000)

    # ------------------------------------------------------------------ the space
    def _checkpoints(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for part in self.checkpoints.text().split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise ValueError(f"checkpoint {part.strip()!r}: write QUANT=MODEL, e.g. awq=…-AWQ-INT4")
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip()
        return out

    def form(self, full_space: bool = False) -> dict[str, Any]:
        """The tab's inputs as :func:`app.tuner.report.build_spec` keywords (read on the
        GUI thread; ``full_space``: every value, for the pruning display). Raises
        ValueError naming the input."""
        space: dict[str, Any] = {"checkpoints": self._checkpoints() or None}
        if not full_space:
            space.update(self.selection())
        mm = self.max_minutes.value()
        return dict(slo=self.slo(), space=space, prompt_tokens=self.prompt_tokens.value(),
                    output_tokens=self.output_tokens.value(), objective=self.objective.currentData(),
                    max_launches=self.max_launches.value(), max_minutes=mm if mm > 0 else None)

    @staticmethod
    def _spec(start: Any, form: dict[str, Any]):
        """The tune's spec of ``start`` and :meth:`form` (any thread; blocking for engine
        vllm: the interpreter probe). Raises ValueError."""
        sim_args, hw, version, py = report.target_of(start)
        f = dict(form)
        pt, ot, spread, seed = report.workload_from_ramp(start.ramp, f.pop("prompt_tokens"), f.pop("output_tokens"))
        rig = dict(hosts=list(start.hosts), ray_address=start.ray_address) if len(start.hosts) >= 2 else {}
        return report.build_spec(engine=start.engine, config=start.config, hardware=hw, sim_args=sim_args, python=py,
                                 vllm_version=version, prompt_tokens=pt, output_tokens=ot, length_spread=spread,
                                 seed=seed, **rig, **f)

    def slo(self) -> SLO:
        t, p = self.slo_ttft.value(), self.slo_tpot.value()
        return SLO(ttft_p99=t / 1000 if t > 0 else None, tpot_p99=p / 1000 if p > 0 else None)

    def refresh_space(self) -> None:
        """Plan the space of the form's configuration in the background: first the
        planner's pruning (check boxes), then the predictions (the table, the plot)."""
        if self.running:
            return
        self.replan_timer.stop()
        self._stale = False
        self._gen += 1
        gen = self._gen
        try:
            start = self.start_fn()
            form = self.form(full_space=True)
        except ValueError as e:
            self.space_status.setText(f"<span style='{PRUNED_STYLE}'>The form: {html.escape(str(e))}</span>")
            return
        no_slo = form["slo"].is_empty()
        if no_slo:  # the planner's pruning does not depend on it; a spec needs one (no prediction without)
            form["slo"] = SLO(ttft_p99=2.0, tpot_p99=0.1)
        self.space_status.setText("Planning the space…")

        def plan():
            spec = self._spec(start, form)
            return spec, report.space_candidates(spec)

        def planned(out) -> None:
            if gen != self._gen:
                return
            spec, cands = out
            self.start = start
            self._show_space(cands)
            if no_slo:
                self.message.setText("Set TTFT p99 and/or TPOT p99 to see every configuration's predicted users.")
            else:
                self._predict(gen, spec)

        def failed(e: BaseException) -> None:
            if gen == self._gen:
                self.space_status.setText(f"<span style='{PRUNED_STYLE}'>{html.escape(str(e))}</span>")
                self._clear_space()

        self._bg("tune-space", plan, planned, failed)

    def _predict(self, gen: int, spec) -> None:
        self.message.setText("Predicting every configuration (the step-level engine)…")

        def dry():
            return Tuner(spec, controller=self.controller_fn(), store=self.store_fn()).dry_run()

        def done(res) -> None:
            if gen != self._gen or self.running:
                return
            self.message.setText("Predicted (no launch yet): Start measures the best of them.")
            self.show_result(res)

        def failed(e: BaseException) -> None:
            if gen == self._gen and not self.running:
                self.message.setText(f"No prediction: {e}")

        self._bg("tune-predict", dry, done, failed)

    def _clear_space(self) -> None:
        while self.space_box.count():
            it = self.space_box.takeAt(0)
            if it.widget() is not None:
                it.widget().deleteLater()
        self.boxes, self.reasons = {}, {}

    def _show_space(self, cands: list[dict[str, Any]]) -> None:
        """One row per dimension, a check box per value; a pruned value unchecked,
        disabled, struck through, with the planner's reason beside it (and as its tooltip)."""
        old = {f: {v: b.isChecked() for v, b in bs.items()} for f, bs in self.boxes.items()}
        self._clear_space()
        self.status = report.value_status(cands)
        self.models = {c["checkpoint"]: c["server"].get("model") for c in cands if c.get("checkpoint")}
        for _name, field, label in report.DIMENSIONS:
            values = self.status.get(field) or {}
            if not values:
                continue
            self.space_box.addWidget(QLabel(f"<b>{html.escape(label)}</b>"))
            line = QWidget()
            lh = QHBoxLayout(line)
            lh.setContentsMargins(12, 0, 0, 0)
            lh.setSpacing(10)
            self.space_box.addWidget(line)
            self.boxes[field], self.reasons[field] = {}, {}
            notes = []
            for v, why in values.items():
                text = report.value_label(field, v)
                tip = f"{label} = {text}"
                if field == "checkpoint" and self.models.get(v):
                    tip = f"{v}: {self.models[v]}"
                b = QCheckBox(text)
                b.setObjectName(f"tune_{field}_{v}")
                if why is None:
                    b.setChecked(old.get(field, {}).get(v, True))
                    b.setToolTip(tip + ": some configuration with it can start")
                else:
                    b.setChecked(False)
                    b.setEnabled(False)
                    font = b.font()
                    font.setStrikeOut(True)
                    b.setFont(font)
                    b.setToolTip(f"{tip}: pruned by the planner: {why}")
                    notes.append((v, text, why))
                lh.addWidget(b)
                self.boxes[field][v] = b
            lh.addStretch(1)
            for v, text, why in notes:  # the planner's reason under the row, by the value's name
                r = QLabel(f"✗ {html.escape(text)}: {html.escape(_short(why))}")
                r.setWordWrap(True)
                r.setStyleSheet(PRUNED_STYLE + " font-size:8pt; margin-left:12px;")
                r.setToolTip(why)
                self.space_box.addWidget(r)
                self.reasons[field][v] = r
        n = len(cands)
        pruned = sum(c["pruned_because"] is not None for c in cands)
        self.space_status.setText(f"{n} configurations, {n - pruned} can start, {pruned} pruned by the planner. "
                                  "Untick what you do not want tried.")

    def selection(self) -> dict[str, Any]:
        """The ticked values as TuneSpace fields (None: every value of the dimension).
        Raises ValueError naming a dimension with nothing ticked."""
        out: dict[str, Any] = {}
        names = {field: name for name, field, _ in report.DIMENSIONS}
        for field, boxes in self.boxes.items():
            if not boxes:
                continue
            on = [v for v, b in boxes.items() if b.isChecked()]
            if not on:
                raise ValueError(f"{field}: tick at least one value")
            if len(on) == sum(b.isEnabled() for b in boxes.values()):
                continue  # every value that can start: the dimension's default (the pruned stay pruned)
            if field == "checkpoint":
                out["checkpoints"] = {k: self.models[k] for k in on if k in self.models}
            else:
                out[names[field]] = on
        return out

    # ------------------------------------------------------------------ the tune
    def start_tune(self) -> None:
        if self.running:
            return
        why = self.block_fn()
        if why:
            self.progress.setText(f"<span style='{PRUNED_STYLE}'>Cannot start: {html.escape(why)}</span>")
            return
        try:
            start = self.start_fn()
            form = self.form()
        except ValueError as e:
            QMessageBox.warning(self, "Tune", str(e))
            return
        if self.slo().is_empty():
            QMessageBox.warning(self, "Tune", "A tune needs an SLO to judge capacities on: set TTFT p99 and/or "
                                              "TPOT p99.")
            return
        start = self.confirm_fn(start)  # the launches' bind beyond loopback (a rig's head), confirmed
        if start is None:
            self.progress.setText("Not started: the launches' address beyond this machine was not confirmed")
            return
        self._gen += 1  # a prediction still running is not shown over the tune
        self._stop_asked = False
        self.start = start
        self.res = None
        self.clock = report.ProgressClock(self.max_launches.value(), self.max_minutes.value() or None, self.now_fn())
        self.bar.setRange(0, self.max_launches.value())
        self.bar.setValue(0)
        self.message.setText("")
        self.sentence.setText("")
        for fr, _ in self.card_labels:
            fr.hide()
        listener = _ToQt(self)

        def body():
            spec = self._spec(start, form)
            tuner = Tuner(spec, controller=self.controller_fn(), store=self.store_fn(), listener=listener,
                          pricing=self.pricing_fn(), ssh=start.ssh, expose=start.expose)
            listener.tuner = tuner
            self.tuner = tuner
            self.tuned_spec = spec  # what the recommendation was judged on (Save as profile)
            if self._stop_asked:
                raise TuneAborted("the tune was stopped before it started")
            tuner.run()
            return tuner.result()

        self.thread = self._bg("tune", body, self._finished, self._failed)
        self._set_running(True)
        self.running_changed.emit(True)
        self._tick()

    def stop_tune(self) -> None:
        """Abort the tune: the running search stops, the server is stopped (on the tune's
        thread); the tune is saved as interrupted."""
        self._stop_asked = True
        if self.tuner is not None:
            self.tuner.abort()
        self.progress.setText("Stopping: the server is being stopped…")

    def shutdown(self, timeout: float = 60.0) -> None:
        """Stop a running tune and wait for its thread (the window closes)."""
        self.timer.stop()
        self.replan_timer.stop()
        self._gen += 1
        if self.running:
            self.stop_tune()
        deadline = time.monotonic() + timeout
        for t in [self.thread, *self.background]:
            if t is not None:
                t.join(max(0.0, deadline - time.monotonic()))

    def _bg(self, name: str, fn, on_done, on_error) -> threading.Thread:
        t = run_in_background(name, fn, on_done, on_error)
        self.background = [x for x in self.background if x.is_alive()] + [t]
        return t

    def _on_progress(self, res: dict[str, Any], message: str) -> None:
        if self.clock is not None:
            self.clock.update(res, message, self.now_fn())
            self.bar.setValue(self.clock.launch())
        self.message.setText(html.escape(message))
        self.show_result(res, final=False)
        self._tick()

    def _tick(self) -> None:
        if self.clock is not None and self.running:
            self.progress.setText(self.clock.text(self.now_fn()))

    def _finished(self, res: dict[str, Any]) -> None:
        self.tuner = None
        self.thread = None
        self.show_result(res, final=True)
        rec = res.get("recommendation")
        self.progress.setText(f"Tune {res.get('tune_id')} done: {res['launches']} launch"
                              f"{'es' if res['launches'] != 1 else ''}, {res['wall_seconds'] / 60:.1f} min; "
                              f"stopped: {res.get('stop_reason')}")
        if rec is None:
            self.sentence.setText(report.no_recommendation_text())
        self._set_running(False)
        self.running_changed.emit(False)

    def _failed(self, e: BaseException) -> None:
        tid = self.tuner.tune_id if self.tuner is not None else None
        self.tuner = None
        self.thread = None
        if isinstance(e, TuneAborted):
            self.progress.setText("Stopped." + (f" Resume with: vllm-dyno tune --resume {tid}" if tid else ""))
        else:
            self.progress.setText(f"<span style='{PRUNED_STYLE}'>The tune failed: {html.escape(str(e))}</span>")
        self._set_running(False)
        self.running_changed.emit(False)

    # ------------------------------------------------------------------ showing a result
    def show_result(self, res: dict[str, Any], final: bool = True) -> None:
        """The candidates, the Pareto plot and (with a recommendation) the result card."""
        self.res = res
        self._fill_table(res)
        self._fill_plot(res)
        self._fill_cards(res)
        if final:
            self._set_running(self.running)

    def _fill_table(self, res: dict[str, Any]) -> None:
        rows = report.ordered_candidates(res)
        rec_key = (res.get("recommendation") or {}).get("key")
        self.table.setRowCount(len(rows))
        for i, c in enumerate(rows):
            status = ("pruned: " + c["pruned_because"]) if c["pruned_because"] else (
                "recommended" if c["key"] == rec_key else
                ("measured" if c["measured_users"] is not None else ("failed" if c.get("failed") else "")))
            vals = [c["key"], str(c.get("cards") or ""), report.predicted_text(c), report.measured_text(c), status]
            for col, text in enumerate(vals):
                it = QTableWidgetItem(text)
                if c["pruned_because"] is not None:
                    it.setForeground(QColor("#8a1c1c"))
                    it.setToolTip(c["pruned_because"])
                    if col == 0:
                        f = it.font()
                        f.setStrikeOut(True)
                        it.setFont(f)
                elif c["key"] == rec_key:
                    f = it.font()
                    f.setBold(True)
                    it.setFont(f)
                if col in (1, 2, 3):
                    it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.table.setItem(i, col, it)

    def _fill_plot(self, res: dict[str, Any]) -> None:
        pts = report.pareto_points(res)

        def xy(ps):
            return [p.per_user for p in ps], [p.per_gpu for p in ps]

        self.pred_pts.setData(*xy([p for p in pts if not p.measured]))
        self.met_pts.setData(*xy([p for p in pts if p.measured and p.slo_met]))
        self.broke_pts.setData(*xy([p for p in pts if p.measured and not p.slo_met]))
        self.front.setData(*xy(report.pareto_front(pts)))
        rp = report.recommended_point(res)
        self.rec_pt.setData(*xy([rp] if rp is not None else []))
        floor = report.slo_per_user_floor(res)
        pi = self.plot.getPlotItem()
        if floor is not None:
            self.slo_line.setValue(floor)
            xs = [p.per_user for p in pts] or [floor * 2]
            self.slo_shade.setRegion((min(min(xs), floor) * 0.5, floor))
            name = f"TPOT p99 ≤ {1000 / floor:g} ms"
            self.legend.removeItem(self.slo_key)
            self.slo_key.opts["name"] = name
            self.legend.addItem(self.slo_key, name)
            for it in (self.slo_line, self.slo_shade):
                it.show()
        else:
            self.legend.removeItem(self.slo_key)
            for it in (self.slo_line, self.slo_shade):
                it.hide()
        pi.enableAutoRange()
        self.legend_fit.reset()  # its entries changed

    def _fill_cards(self, res: dict[str, Any]) -> None:
        cols = report.result_columns(res) if res.get("recommendation") else []
        cards_of = {c["key"]: c.get("cards") or 1 for c in res["candidates"]}
        default_cards = max(cards_of.values(), default=1)
        for i, (fr, lab) in enumerate(self.card_labels):
            if i >= len(cols):
                fr.hide()
                continue
            title, e = cols[i]
            figs = report.entry_figures(e, cards_of.get(e.get("key"), default_cards), self.pricing_fn())
            rows = "".join(f"<tr><td style='color:#555; padding-right:6px'>{html.escape(k)}</td>"
                           f"<td><b>{html.escape(v)}</b></td></tr>" for k, v in figs if k)
            tag = next((v for k, v in figs if not k), "")
            flags = html.escape(report.card_flags(e))
            lab.setToolTip(report.flags_text(e.get("server") or {}))
            err = f"<br><span style='{PRUNED_STYLE}'>{html.escape(e['error'][:200])}</span>" if e.get("error") else ""
            lab.setText(f"<span style='font-size:11pt; font-weight:600'>{html.escape(title)}</span> "
                        f"<span style='color:#555'>({html.escape(tag)})</span><table>{rows}</table>"
                        f"<span style='font-size:8pt; color:#333'>{flags}</span>{err}")
            fr.show()
        rec = res.get("recommendation")
        if rec:
            mark = "✔ " if rec.get("verified") else "(not confirmed) "
            self.sentence.setText(mark + (rec.get("sentence") or ""))

    # ------------------------------------------------------------------ exports
    def recommended_server(self) -> dict[str, Any] | None:
        rec = (self.res or {}).get("recommendation")
        return rec.get("server") if rec else None

    def serve_command(self) -> str | None:
        server = self.recommended_server()
        return report.vllm_serve_command(server) if server else None

    def copy_command(self) -> None:
        cmd = self.serve_command()
        if cmd:
            QGuiApplication.clipboard().setText(cmd)
            self.message.setText("Copied: " + html.escape(cmd))

    def export_config(self, path: str) -> None:
        server = self.recommended_server()
        if server is None:
            raise ValueError("no recommendation to export yet")
        report.export_config(path, server)

    def export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export --config YAML", "vllm-config.yaml", "YAML (*.yaml *.yml)")
        if not path:
            return
        try:
            self.export_config(path)
        except (ValueError, OSError) as e:
            QMessageBox.warning(self, "Export", f"Cannot write {path}: {e}")
            return
        self.message.setText(f"Wrote {html.escape(path)} (vllm serve --config {html.escape(path)})")

    def tuned_profile(self, name: str | None = None):
        """The recommendation as a profile (app.tuner.report.tuned_profile: every option
        the tune launched, the rig it ran on, a name and description from the result).
        Raises ValueError without a recommendation."""
        if self.res is None or not self.res.get("recommendation") or self.tuned_spec is None:
            raise ValueError("no recommendation yet")
        st = self.start
        return report.tuned_profile(self.res, self.tuned_spec, engine=st.engine if st else None,
                                    sim=st.sim if st else None, base=st.profile if st else None, name=name)

    def save_profile(self, name: str) -> str:
        """Save the recommendation as profile ``name`` (:meth:`tuned_profile`); returns the
        path. Raises ValueError / OSError."""
        if self.res is None or not self.res.get("recommendation") or self.tuned_spec is None:
            raise ValueError("no recommendation to save yet")
        st = self.start
        path = report.save_as_profile(self.res, self.tuned_spec, engine=st.engine if st else None,
                                      sim=st.sim if st else None, base=st.profile if st else None, name=name)
        self.profile_saved.emit(name)
        return path

    def launch_recommended(self) -> None:
        """Ask the window to launch the recommendation (its forms show it, unsaved)."""
        try:
            self.launch_requested.emit(self.tuned_profile())
        except ValueError as e:
            self.message.setText(html.escape(str(e)))

    def verify_recommended(self) -> None:
        """Ask the window to launch the recommendation and run a capacity search from the
        users the tune measured (app.tuner.report.verify_ramp)."""
        try:
            prof = self.tuned_profile()
        except ValueError as e:
            self.message.setText(html.escape(str(e)))
            return
        self.verify_requested.emit(prof, report.verify_ramp(self.res or {}, self.tuned_spec))

    def save_profile_dialog(self) -> None:
        try:
            proposed = self.tuned_profile().name
        except ValueError:
            proposed = "tuned"
        name, ok = QInputDialog.getText(self, "Save as profile", "Profile name:", text=proposed)
        if not ok or not name.strip():
            return
        try:
            path = self.save_profile(name.strip())
        except (ValueError, OSError) as e:
            QMessageBox.warning(self, "Save as profile", f"Cannot save the profile: {e}")
            return
        self.message.setText(f"Saved as profile {html.escape(name.strip())!r}: {html.escape(path)}")


def _short(why: str, n: int = 110) -> str:
    """The planner's reason cut to one readable line (the tooltip has it whole)."""
    return why if len(why) <= n else why[: n - 1].rstrip() + "…"
