"""The Tune tab (issue 18): the search space as check boxes with the planner's reason next
to every pruned value, the SLO, workload, objective and budget, Start/Stop; live progress,
the candidate table, the Pareto plot with the SLO boundary, and the result card with its
exports.

Presentation only: the tune is :class:`app.tuner.tune.Tuner` launching through the main
window's run controller (so the Live plots, the Log and the run store see every launch);
the space's values, the Pareto points and the exports are :mod:`app.tuner.report`'s. The
blocking calls (the dry run, the tune) run on background threads; progress arrives as a
Qt signal on the GUI thread.
"""
from __future__ import annotations

import html
import threading
import time
from typing import Any, Callable, Optional

import pyqtgraph as pg
from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from app.fileio import write_atomic
from app.loadgen.spec import SLO
from app.tuner.report import (
    DIMENSION_TITLES,
    NOTHING_MET,
    DimensionValue,
    dimension_values,
    flags_text,
    fmt_users,
    measured_text,
    narrowed_space,
    ordered_candidates,
    pareto_front,
    pareto_points,
    predicted_text,
    result_columns,
    save_as_profile,
    slo_per_user_floor,
    tune_rig,
    vllm_config_yaml,
    vllm_serve_command,
)
from app.tuner.space import TuneSpace
from app.tuner.tune import OBJECTIVES, TuneAborted, Tuner, TuneListener, TuneSpec, TuneState
from widgets.tasks import on_gui_thread, run_in_background

#: the candidate table's columns
COLUMNS = ("configuration", "predicted users", "measured users (interval)", "out tok/s", "state")
PRUNED_STYLE = "color:#8a4b08"
CARD_STYLE = ("#tunecard { background:#e8f1fb; border:1px solid #2f6db5; border-radius:4px; padding:6px; "
              "color:#102a43; }")


class TuneInputs:
    """What the main window gives a tune: the engine (``sim`` or ``vllm``), the starting
    ServerConfig, the sim rig (SimRig or None), the vLLM interpreter, the loaded profile
    (the base of a saved one) and the pricing (Settings)."""

    def __init__(self, engine: str, config, sim=None, python: Optional[str] = None, profile=None,
                 pricing=None, startup_timeout: Optional[float] = None) -> None:
        self.engine, self.config, self.sim, self.python = engine, config, sim, python
        self.profile, self.pricing, self.startup_timeout = profile, pricing, startup_timeout


class _Progress(QObject):
    """Tuner callbacks (its thread) → a signal on the GUI thread."""

    progress = Signal(object, str)


class _Listener(TuneListener):
    def __init__(self, relay: _Progress) -> None:
        self.relay = relay

    def on_progress(self, state: TuneState, message: str) -> None:
        snap = state.model_copy(deep=True)
        on_gui_thread(lambda: self.relay.progress.emit(snap, message))


class TunePanel(QWidget):
    """The Tune tab. ``inputs_fn()`` → :class:`TuneInputs` (raises ValueError naming what
    the form lacks); ``controller_fn()`` → the main window's RunController (None: the
    tuner's own); ``store_fn()`` → the run store; ``busy_fn()`` → a reason a tune cannot
    start now (a server or ramp of the session running) or None.

    Signals: ``started()``, ``finished(dict)`` (the result, or ``{}`` when stopped or
    failed), ``profile_saved(str)``."""

    started = Signal()
    finished = Signal(dict)
    profile_saved = Signal(str)

    def __init__(self, inputs_fn: Callable[[], TuneInputs], controller_fn: Callable[[], Any],
                 store_fn: Callable[[], Any], busy_fn: Callable[[], Optional[str]] = lambda: None) -> None:
        super().__init__()
        self.inputs_fn, self.controller_fn, self.store_fn, self.busy_fn = inputs_fn, controller_fn, store_fn, busy_fn
        self.tuner: Optional[Tuner] = None
        self.thread: Optional[threading.Thread] = None
        self.dry: Optional[dict] = None  # the dry run the check boxes show
        self.dry_spec: Optional[TuneSpec] = None
        self.result: Optional[dict] = None
        self.inputs: Optional[TuneInputs] = None
        self.boxes: dict[str, list[tuple[QCheckBox, DimensionValue]]] = {}
        self._t0 = 0.0
        self._last_state: Optional[TuneState] = None
        self._relay = _Progress()
        self._relay.progress.connect(self._on_progress)
        self._build()
        self._set_running(False)

    # ------------------------------------------------------------------ layout
    def _build(self) -> None:
        outer = QHBoxLayout(self)
        outer.setContentsMargins(4, 4, 4, 4)
        split = QSplitter(Qt.Horizontal)
        outer.addWidget(split)

        # ---- left: inputs
        form_w = QWidget()
        fl = QVBoxLayout(form_w)
        goal = QGroupBox("Goal")
        gf = QFormLayout(goal)
        self.slo_ttft = QDoubleSpinBox(decimals=2, minimum=0.0, maximum=600.0, singleStep=0.1, value=2.0)
        self.slo_ttft.setSuffix(" s")
        self.slo_ttft.setSpecialValueText("none")
        self.slo_ttft.setToolTip("Time to first token, 99th percentile, that every level must meet (0: no TTFT SLO)")
        self.slo_tpot = QDoubleSpinBox(decimals=0, minimum=0.0, maximum=60000.0, singleStep=10.0, value=100.0)
        self.slo_tpot.setSuffix(" ms")
        self.slo_tpot.setSpecialValueText("none")
        self.slo_tpot.setToolTip("Time per output token, 99th percentile (0: no TPOT SLO)")
        self.prompt_tokens = QSpinBox(minimum=1, maximum=1_000_000, value=512)
        self.output_tokens = QSpinBox(minimum=1, maximum=1_000_000, value=128)
        for w in (self.prompt_tokens, self.output_tokens):
            w.setSuffix(" tokens")
            w.setToolTip("The mean; each request's length is drawn within ±25 % (seeded)")
        self.objective = QComboBox()
        labels = {"users": "most users at the SLO", "throughput": "most output tok/s at the SLO",
                  "cost": "lowest $ per M tokens at the SLO", "energy": "lowest J/token at the SLO"}
        for o in OBJECTIVES:
            self.objective.addItem(labels[o], o)
        self.max_launches = QSpinBox(minimum=1, maximum=100, value=4)
        self.max_launches.setToolTip("Server launches in all, the confirming launch of the recommendation included")
        self.max_minutes = QSpinBox(minimum=0, maximum=10_000, value=0)
        self.max_minutes.setSuffix(" min")
        self.max_minutes.setSpecialValueText("no limit")
        gf.addRow("TTFT p99 ≤", self.slo_ttft)
        gf.addRow("TPOT p99 ≤", self.slo_tpot)
        gf.addRow("Prompt", self.prompt_tokens)
        gf.addRow("Output", self.output_tokens)
        gf.addRow("Objective", self.objective)
        gf.addRow("Max launches", self.max_launches)
        gf.addRow("Max time", self.max_minutes)
        fl.addWidget(goal)

        space = QGroupBox("Search space")
        sv = QVBoxLayout(space)
        self.checkpoints = QLineEdit()
        self.checkpoints.setPlaceholderText("more checkpoints: fp8=org/Model-FP8, gptq=org/Model-GPTQ")
        self.checkpoints.setToolTip("One checkpoint per quantization (label=model id), besides the profile's model")
        sv.addWidget(self.checkpoints)
        row = QHBoxLayout()
        self.plan_btn = QPushButton("Plan the space")
        self.plan_btn.setToolTip("Enumerate the configurations of these cards; the planner prunes what cannot "
                                 "start and says why, and predicts the rest")
        self.plan_btn.clicked.connect(self.plan_space)
        row.addWidget(self.plan_btn)
        self.space_summary = QLabel("")
        self.space_summary.setWordWrap(True)
        row.addWidget(self.space_summary, 1)
        sv.addLayout(row)
        self.dims_w = QWidget()
        self.dims_l = QVBoxLayout(self.dims_w)
        self.dims_l.setContentsMargins(0, 0, 0, 0)
        sv.addWidget(self.dims_w)
        fl.addWidget(space)

        btns = QHBoxLayout()
        self.start_btn = QPushButton("Start tune")
        self.start_btn.clicked.connect(self.start)
        self.stop_btn = QPushButton("Stop")
        self.stop_btn.setToolTip("Stop the tune: the server is stopped and the tune saved "
                                 "(`vllm-dyno tune --resume ID` continues it)")
        self.stop_btn.clicked.connect(self.stop)
        btns.addWidget(self.start_btn)
        btns.addWidget(self.stop_btn)
        fl.addLayout(btns)
        fl.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(form_w)
        scroll.setMinimumWidth(330)
        split.addWidget(scroll)

        # ---- right: progress, candidates, Pareto, result
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        prow = QHBoxLayout()
        self.progress = QProgressBar()
        self.progress.setFormat("launch %v of ≤ %m")
        self.progress.setValue(0)
        prow.addWidget(self.progress)
        self.elapsed = QLabel("")
        prow.addWidget(self.elapsed)
        rl.addLayout(prow)
        self.phase = QLabel("Plan the space, set the SLO and start: the tuner launches the best predicted "
                            "configuration, measures its capacity, re-predicts the rest and stops when "
                            "nothing is predicted to beat it.")
        self.phase.setWordWrap(True)
        rl.addWidget(self.phase)

        vsplit = QSplitter(Qt.Vertical)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.setSelectionBehavior(QTableWidget.SelectRows)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(0, QHeaderView.Stretch)
        for i in range(1, len(COLUMNS)):
            hh.setSectionResizeMode(i, QHeaderView.ResizeToContents)
        vsplit.addWidget(self.table)

        bottom = QSplitter(Qt.Horizontal)
        self.plot = pg.PlotWidget(background="w")
        self.plot.setTitle("Pareto front at the SLO", color="#102a43")
        self.plot.setLabel("bottom", "output tok/s per user")
        self.plot.setLabel("left", "output tok/s per GPU")
        self.plot.showGrid(x=True, y=True, alpha=0.3)
        # top right: beyond the Pareto front (nothing serves more per user and per GPU at once)
        self.legend = self.plot.addLegend(offset=(-10, 10), brush=pg.mkBrush(255, 255, 255, 210),
                                          pen=pg.mkPen("#cbd2d9"))
        self.pred_scatter = pg.ScatterPlotItem(pen=pg.mkPen("#9aa5b1"), brush=pg.mkBrush(0, 0, 0, 0), size=8,
                                               name="predicted")
        self.meas_scatter = pg.ScatterPlotItem(pen=pg.mkPen("#2f6db5"), brush=pg.mkBrush("#2f6db5"), size=10,
                                               name="measured")
        self.rec_scatter = pg.ScatterPlotItem(pen=pg.mkPen("#1a7f37", width=2), brush=pg.mkBrush("#1a7f37"),
                                              size=16, symbol="star", name="recommended")
        self.front = pg.PlotDataItem(pen=pg.mkPen("#2f6db5", width=1, style=Qt.DashLine), name="Pareto front")
        for it in (self.front, self.pred_scatter, self.meas_scatter, self.rec_scatter):
            self.plot.addItem(it)
        self.slo_line = pg.InfiniteLine(angle=90, pen=pg.mkPen("#c0392b", width=1.5, style=Qt.DashLine),
                                        label="", labelOpts={"position": 0.92, "color": "#c0392b"})
        self.plot.addItem(self.slo_line)
        self.slo_line.hide()
        self.plot.setMinimumWidth(360)
        bottom.addWidget(self.plot)

        card_w = QWidget()
        cl = QVBoxLayout(card_w)
        cl.setContentsMargins(0, 0, 0, 0)
        self.card = QTextBrowser()  # wraps the sentence and the table to the width it gets
        self.card.setObjectName("tunecard")
        self.card.setStyleSheet(CARD_STYLE)
        self.card.setOpenLinks(False)
        self.card.hide()
        cl.addWidget(self.card, 1)
        ex = QHBoxLayout()
        self.save_btn = QPushButton("Save as profile…")
        self.save_btn.clicked.connect(self._save_profile_dialog)
        self.copy_btn = QPushButton("Copy vllm serve")
        self.copy_btn.setToolTip("Copy the recommendation as a `vllm serve` command")
        self.copy_btn.clicked.connect(self.copy_command)
        self.yaml_btn = QPushButton("Export --config…")
        self.yaml_btn.setToolTip("Write the recommendation as a vLLM --config YAML file")
        self.yaml_btn.clicked.connect(self._export_dialog)
        for b in (self.save_btn, self.copy_btn, self.yaml_btn):
            ex.addWidget(b)
        cl.addLayout(ex)
        bottom.addWidget(card_w)
        bottom.setSizes([470, 560])
        vsplit.addWidget(bottom)
        vsplit.setSizes([210, 430])
        rl.addWidget(vsplit, 1)
        split.addWidget(right)
        split.setStretchFactor(0, 0)
        split.setStretchFactor(1, 1)
        split.setSizes([360, 900])
        self._set_exports(False)

    # ------------------------------------------------------------------ state
    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def _set_running(self, on: bool) -> None:
        self.start_btn.setEnabled(not on)
        self.plan_btn.setEnabled(not on)
        self.stop_btn.setEnabled(on)
        for w in (self.slo_ttft, self.slo_tpot, self.prompt_tokens, self.output_tokens, self.objective,
                  self.max_launches, self.max_minutes, self.checkpoints, self.dims_w):
            w.setEnabled(not on)

    def _set_exports(self, on: bool) -> None:
        for b in (self.save_btn, self.copy_btn, self.yaml_btn):
            b.setEnabled(on)

    def slo(self) -> SLO:
        return SLO(ttft_p99=self.slo_ttft.value() or None,
                   tpot_p99=(self.slo_tpot.value() / 1000.0) or None)

    def _checkpoints(self) -> dict[str, str]:
        out = {}
        for part in self.checkpoints.text().replace(";", ",").split(","):
            if not part.strip():
                continue
            if "=" not in part:
                raise ValueError(f"checkpoint {part.strip()!r}: write label=model id, e.g. fp8=org/Model-FP8")
            k, v = (x.strip() for x in part.split("=", 1))
            if not k or not v:
                raise ValueError(f"checkpoint {part.strip()!r}: write label=model id, e.g. fp8=org/Model-FP8")
            out[k] = v
        return out

    def _chosen(self) -> dict[str, list[Any]]:
        """The kept values of every dimension whose check boxes are shown (only those
        the user unticked narrow the space)."""
        out = {}
        for dim, boxes in self.boxes.items():
            kept = [v.value for b, v in boxes if b.isChecked() and b.isEnabled()]
            runnable = [v.value for _b, v in boxes if v.reason is None]
            if sorted(map(str, kept)) != sorted(map(str, runnable)):
                out[dim] = kept
        return out

    def build_spec(self, inputs: TuneInputs, narrowed: bool = True) -> TuneSpec:
        """The TuneSpec of the form (blocking: the rig's probe). Raises ValueError naming
        the input."""
        slo = self.slo()
        if slo.is_empty():
            raise ValueError("a tune needs an SLO: set TTFT p99 and/or TPOT p99")
        if inputs.config is None:
            raise ValueError("the Server form is not complete")
        sim_args, hw, version, python = tune_rig(inputs.engine, inputs.config, inputs.sim, inputs.python)
        space = TuneSpace(checkpoints=self._checkpoints())
        if narrowed and self.dry is not None and self.boxes:
            space = narrowed_space(space, self._chosen(), self.dry)
        extra = {"startup_timeout": inputs.startup_timeout} if inputs.startup_timeout else {}
        return TuneSpec(engine=inputs.engine, config=inputs.config, sim_args=sim_args, hardware=hw, python=python,
                        vllm_version=version, prompt_tokens=self.prompt_tokens.value(),
                        output_tokens=self.output_tokens.value(), slo=slo, objective=self.objective.currentData(),
                        space=space, max_launches=self.max_launches.value(),
                        max_minutes=self.max_minutes.value() or None, **extra)

    # ------------------------------------------------------------------ the space
    def plan_space(self) -> threading.Thread | None:
        """Dry run in the background: the check boxes, the table and the predicted points."""
        try:
            inputs = self.inputs_fn()
        except ValueError as e:
            self.space_summary.setText(f"<span style='{PRUNED_STYLE}'>{html.escape(str(e))}</span>")
            return None
        self.plan_btn.setEnabled(False)
        self.space_summary.setText("planning every configuration…")

        def work():
            spec = self.build_spec(inputs, narrowed=False)
            return spec, Tuner(spec, store=self.store_fn(), pricing=inputs.pricing).dry_run()

        def done(out) -> None:
            self.plan_btn.setEnabled(not self.running)
            self.dry_spec, self.dry = out
            self._show_space(self.dry)
            self._show_result(self.dry, final=False)

        def failed(e: BaseException) -> None:
            self.plan_btn.setEnabled(not self.running)
            self.space_summary.setText(f"<span style='{PRUNED_STYLE}'>{html.escape(str(e))}</span>")

        return run_in_background("tune-plan", work, done, failed)

    def _show_space(self, res: dict) -> None:
        while self.dims_l.count():
            it = self.dims_l.takeAt(0)
            if it.widget() is not None:
                it.widget().deleteLater()
        self.boxes = {}
        n = len(res["candidates"])
        pruned = sum(c["pruned_because"] is not None for c in res["candidates"])
        self.space_summary.setText(f"{n - pruned} of {n} configurations can start")
        for dim, vals in dimension_values(res).items():
            if len(vals) < 2 and all(v.reason is None for v in vals):
                continue  # one value, nothing to choose
            box = QGroupBox(DIMENSION_TITLES.get(dim, dim))
            bl = QVBoxLayout(box)
            bl.setSpacing(2)
            bl.setContentsMargins(6, 4, 6, 4)
            items = []
            for v in vals:
                cb = QCheckBox(v.label)
                line = QHBoxLayout()
                line.addWidget(cb)
                if v.reason is not None:
                    cb.setChecked(False)
                    cb.setEnabled(False)
                    why = QLabel(f"<span style='{PRUNED_STYLE}'>pruned: {html.escape(v.reason[:90])}</span>")
                    why.setWordWrap(True)
                    why.setToolTip(v.reason)
                    cb.setToolTip(v.reason)
                    line.addWidget(why, 1)
                else:
                    cb.setChecked(True)
                    if v.pruned:
                        note = QLabel(f"<span style='color:#52606d'>{v.pruned} of {v.candidates} pruned</span>")
                        reasons = sorted({c["pruned_because"] for c in res["candidates"]
                                          if c["pruned_because"] is not None})
                        note.setToolTip("\n".join(r[:200] for r in reasons[:5]))
                        line.addWidget(note, 1)
                    else:
                        line.addStretch(1)
                bl.addLayout(line)
                items.append((cb, v))
            self.boxes[dim] = items
            self.dims_l.addWidget(box)

    # ------------------------------------------------------------------ running
    def start(self) -> bool:
        """Start a tune (returns False with the reason shown when it cannot)."""
        if self.running:
            return False
        busy = self.busy_fn()
        if busy:
            self.phase.setText(f"<span style='{PRUNED_STYLE}'>Cannot start: {html.escape(busy)}</span>")
            return False
        try:
            self.inputs = inputs = self.inputs_fn()
            spec = self.build_spec(inputs)
        except ValueError as e:
            self.phase.setText(f"<span style='{PRUNED_STYLE}'>Cannot start: {html.escape(str(e))}</span>")
            return False
        self.result = None
        self._set_exports(False)
        self.card.hide()
        self.tuner = Tuner(spec, controller=self.controller_fn(), store=self.store_fn(), listener=_Listener(self._relay),
                           pricing=inputs.pricing)
        self.progress.setMaximum(spec.max_launches)
        self.progress.setValue(0)
        self._t0 = time.monotonic()
        self._set_running(True)
        self.phase.setText("planning every configuration…")
        tuner = self.tuner

        def body() -> None:
            try:
                tuner.run()
                res = tuner.result()
                on_gui_thread(lambda: self._on_finished(res, None))
            except TuneAborted:
                on_gui_thread(lambda: self._on_finished(None, f"stopped — the tune is saved: "
                                                              f"vllm-dyno tune --resume {tuner.tune_id}"))
            except BaseException as e:  # shown in the tab, never raised on the worker
                on_gui_thread(lambda e=e: self._on_finished(None, str(e) or type(e).__name__))

        self.thread = threading.Thread(target=body, name="dyno-gui-tune", daemon=True)
        self.thread.start()
        self.started.emit()
        return True

    def stop(self) -> None:
        """Stop the tune (its server is stopped; the state is saved, resumable)."""
        if self.tuner is not None and self.running:
            self.phase.setText("stopping: the server is being stopped; the tune is saved")
            self.stop_btn.setEnabled(False)
            self.tuner.abort()

    def shutdown(self, timeout: float = 30.0) -> None:
        """Blocking stop (window close, tests)."""
        if self.tuner is not None and self.running:
            self.tuner.abort()
        if self.thread is not None:
            self.thread.join(timeout)

    def _on_progress(self, state: TuneState, message: str) -> None:
        self._last_state = state
        done = sum(1 for x in state.launches if x.status != "running")
        cur = next((x for x in state.launches if x.status == "running"), None)
        self.progress.setValue(len(state.launches))
        el = time.monotonic() - self._t0
        eta = ""
        if done and self.tuner is not None:
            per = sum(x.wall_seconds or 0 for x in state.launches if x.status != "running") / done
            left = max(0, self.tuner.spec.max_launches - len(state.launches)) + (1 if cur else 0)
            eta = f" · ETA ≤ {per * left / 60:.1f} min (at most {left} more launch{'es' if left != 1 else ''})"
        self.elapsed.setText(f"elapsed {el / 60:.1f} min{eta}")
        phase = f"launch {cur.n}: {cur.purpose} {cur.key}" if cur else state.phase
        self.phase.setText(f"<b>{html.escape(phase)}</b> — {html.escape(message)}")
        if self.tuner is not None:
            try:
                self._show_result(self.tuner.result(state), final=False)
            except Exception:  # a partial state: the table waits for the next
                pass

    def _on_finished(self, res: Optional[dict], error: Optional[str]) -> None:
        self._set_running(False)
        if res is not None:
            self.result = res
            self.progress.setValue(res["launches"])
            self.elapsed.setText(f"took {(time.monotonic() - self._t0) / 60:.1f} min")
            self.phase.setText(f"<b>done</b> in {res['launches']} launch{'es' if res['launches'] != 1 else ''}, "
                               f"{res['rig_seconds'] / 60:.1f} rig min — {html.escape(res['stop_reason'] or '')}")
            self._show_result(res, final=True)
            self._set_exports(res.get("recommendation") is not None)
            self.finished.emit(res)
        else:
            self.phase.setText(f"<span style='{PRUNED_STYLE}'>{html.escape(error or 'stopped')}</span>")
            self.finished.emit({})

    # ------------------------------------------------------------------ showing
    def _show_result(self, res: dict, final: bool) -> None:
        runnable, pruned = ordered_candidates(res)
        rows = runnable + pruned
        rec_key = (res.get("recommendation") or {}).get("key")
        self.table.setRowCount(len(rows))
        for i, c in enumerate(rows):
            state = ("pruned: " + c["pruned_because"][:120] if c["pruned_because"] else
                     "failed" if c.get("failed") else
                     ("recommended" if c["key"] == rec_key else "measured") if c["measured_users"] is not None
                     else "predicted")
            tps = c.get("measured_tps") if c["measured_users"] is not None else c.get("predicted_tps")
            vals = (c["key"], "" if c["pruned_because"] else predicted_text(c),
                    "" if c["pruned_because"] else measured_text(c), "" if tps is None else f"{tps:,.0f}", state)
            for j, v in enumerate(vals):
                it = QTableWidgetItem(v)
                if c["pruned_because"]:
                    it.setForeground(Qt.gray)
                    it.setToolTip(c["pruned_because"])
                elif c["key"] == rec_key:
                    f = it.font()
                    f.setBold(True)
                    it.setFont(f)
                if j in (1, 2, 3):
                    it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                self.table.setItem(i, j, it)
        self._plot(res)
        if final or res.get("recommendation"):
            self._card(res)

    def _plot(self, res: dict) -> None:
        pts = pareto_points(res)
        pred = [p for p in pts if not p.measured]
        meas = [p for p in pts if p.measured]
        rec = [p for p in pts if p.role == "recommended"]
        self.pred_scatter.setData([p.per_user for p in pred], [p.per_gpu for p in pred],
                                  data=[p.key for p in pred], tip=None)
        self.meas_scatter.setData([p.per_user for p in meas], [p.per_gpu for p in meas], tip=None)
        self.rec_scatter.setData([p.per_user for p in rec], [p.per_gpu for p in rec], tip=None)
        front = pareto_front(meas or pred)
        self.front.setData([p.per_user for p in front], [p.per_gpu for p in front])
        if pts:  # room above and to the right for the legend, and the SLO line in view
            xs = [p.per_user for p in pts] + ([slo_per_user_floor(res.get("slo") or {})] if
                                              slo_per_user_floor(res.get("slo") or {}) else [])
            ys = [p.per_gpu for p in pts]
            x0, x1, y1 = min(xs), max(xs), max(ys)
            self.plot.setXRange(x0 - 0.05 * (x1 - x0 or 1), x1 + 0.45 * (x1 - x0 or 1), padding=0)
            self.plot.setYRange(0, y1 * 1.35, padding=0)
        floor = slo_per_user_floor(res.get("slo") or {})
        if floor is not None:
            self.slo_line.show()
            self.slo_line.setValue(floor)
            self.slo_line.label.setFormat(f"TPOT SLO: ≥ {floor:.0f} tok/s per user")
        else:
            self.slo_line.hide()

    def _card(self, res: dict) -> None:
        cols = result_columns(res)
        rec = res.get("recommendation")
        head = "<tr><th></th>" + "".join(f"<th align='left'>{html.escape(n)}</th>" for n, _ in cols) + "</tr>"

        def row(name: str, fn) -> str:
            return f"<tr><td><b>{name}</b></td>" + "".join(f"<td>{fn(e)}</td>" for _, e in cols) + "</tr>"

        def users(e: dict) -> str:
            u = fmt_users(e.get("users"))
            iv = f" ({fmt_users(e.get('users_low'))}–{fmt_users(e.get('users_high'))})" \
                if e.get("users_low") is not None else ""
            return u + iv + ("" if e.get("measured") else " <i>predicted</i>")

        ref = (cols[0][1].get("server") or {}) if cols else {}

        def flags(e: dict) -> str:
            srv = e.get("server") or {}
            own = srv if srv is ref else {k: v for k, v in srv.items() if ref.get(k) != v}
            text = flags_text(own) if own else "the same flags"
            if srv is not ref and any(k not in srv for k in ref if k not in ("model", "served_model_name", "host")):
                unset = [k for k in ref if k not in srv and k not in ("model", "served_model_name", "host")]
                text += (" " if own else "; ") + " ".join(f"{k}=default" for k in unset)
            out = html.escape(text.replace(" ", "\n")).replace("\n", "<br>")
            if e.get("error"):
                out += f"<br><span style='{PRUNED_STYLE}'>{html.escape(e['error'][:160])}</span>"
            return out

        body = head + row("users at SLO", users) + \
            row("out tok/s", lambda e: "—" if e.get("output_tps") is None else f"{e['output_tps']:,.0f}") + \
            row("flags", flags)
        if len(cols) > 1:
            body += f"<tr><td></td><td colspan='{len(cols)}'><i>other columns: only the flags that differ from " \
                    f"the {html.escape(cols[0][0])}</i></td></tr>"
        sentence = (("✔ " if rec.get("verified") else "(not confirmed) ") + (rec.get("sentence") or "")) if rec \
            else NOTHING_MET
        self.card.setHtml(f"<p>{html.escape(sentence)}</p><table cellspacing='4'>{body}</table>")
        self.card.show()

    # ------------------------------------------------------------------ exports
    def _server(self) -> dict:
        rec = (self.result or {}).get("recommendation")
        if not rec:
            raise ValueError("no recommendation yet: run a tune first")
        return rec["server"]

    def command(self) -> str:
        """The recommendation as a ``vllm serve`` command."""
        return vllm_serve_command(self._server())

    def copy_command(self) -> str:
        cmd = self.command()
        QGuiApplication.clipboard().setText(cmd)
        self.phase.setText(f"copied: <code>{html.escape(cmd)}</code>")
        return cmd

    def export_config(self, path: str) -> str:
        """Write the recommendation as a vLLM ``--config`` YAML file at ``path``."""
        write_atomic(path, vllm_config_yaml(self._server()))
        return path

    def save_profile(self, name: str) -> str:
        """Save the recommendation as a user profile ``name`` (on the starting profile)."""
        inputs = self.inputs
        path = save_as_profile(name, self._server(), inputs.profile if inputs else None,
                               inputs.engine if inputs else "vllm")
        self.profile_saved.emit(name)
        return path

    def _export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export vLLM --config", "vllm-config.yaml", "YAML (*.yaml *.yml)")
        if path:
            try:
                self.export_config(path)
                self.phase.setText(f"vLLM --config written to {html.escape(path)}")
            except (OSError, ValueError) as e:
                QMessageBox.warning(self, "Export --config", f"{path}: {e}")

    def _save_profile_dialog(self) -> None:
        name, ok = QInputDialog.getText(self, "Save as profile", "Profile name:", text="tuned")
        if ok and name.strip():
            try:
                path = self.save_profile(name.strip())
                self.phase.setText(f"saved as profile {html.escape(name.strip())!s}: {html.escape(path)}")
            except (OSError, ValueError) as e:
                QMessageBox.warning(self, "Save as profile", str(e))
