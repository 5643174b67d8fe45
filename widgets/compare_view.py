"""Compare runs: "4 cards or 8? AWQ or FP8?".

Pick two or more recorded runs → overlays of output throughput vs concurrency and TTFT
p99 vs throughput, and a table with tokens/s per GPU, scaling efficiency (vs the run
with the fewest GPUs at the same level), J/token and cost per million output tokens
from a price per GPU-hour (rented) and/or per kWh (owned, from measured power).
Export: PNG (the rendered view) and CSV. The figures are app.comparison's
(:func:`~app.comparison.compare_runs`, :class:`~app.comparison.Comparison`). Below them,
the what-if: a measured run's users at its SLO, output tok/s, scaling and cost predicted
on other counts or kinds of cards (:func:`app.whatif.what_if`), next to the measured row.
"""
from __future__ import annotations

import html

from pathlib import Path
from typing import Any, Callable

import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app import history
from app.comparison import CompareRow, Comparison, compare_runs
from app.loadgen.capacity import slo_text
from app.planner.gpus import catalog_names
from app.settings import Pricing
from app.fileio import write_atomic
from app.whatif import what_if
from widgets.axes import LegendFit, add_legend, LegendPlace, Log2Axis, PlainLogAxis, log2
from widgets.fit import plot_view
from widgets.tasks import run_in_background

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")
SYMBOLS = ("o", "s", "t", "d", "+", "x", "star", "h")


def _f(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


#: the plots, tables and what-if of the comparison take at least this height, px (the tab scrolls)
CANVAS_MIN_HEIGHT = 640
#: a run's label in a legend is cut to this many characters
LEGEND_CHARS = 24


class CompareView(QWidget):
    """``store_fn()`` returns the RunStore. ``compared(Comparison)`` after each update."""

    compared = Signal(object)

    def __init__(self, store_fn: Callable[[], Any], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store_fn = store_fn
        self.comparison: Comparison | None = None
        v = QVBoxLayout(self)
        v.setContentsMargins(4, 4, 4, 4)
        top = QHBoxLayout()
        pick = QVBoxLayout()
        pick.addWidget(QLabel("Runs (tick two or more)"))
        self.runs = QListWidget()
        self.runs.setMaximumHeight(110)
        self.runs.itemChanged.connect(lambda *_: self.update_comparison())
        pick.addWidget(self.runs)
        top.addLayout(pick, 3)
        price = QVBoxLayout()
        row = QHBoxLayout()
        row.addWidget(QLabel("Price per GPU-hour"))
        self.gpu_hour = QDoubleSpinBox()
        self.gpu_hour.setRange(0, 1000)
        self.gpu_hour.setDecimals(3)
        self.gpu_hour.setSpecialValueText("not set")
        self.gpu_hour.setToolTip("Rented cards: cost per M tokens = price × GPUs ÷ (tok/s × 3600) × 10⁶")
        row.addWidget(self.gpu_hour)
        price.addLayout(row)
        row = QHBoxLayout()
        row.addWidget(QLabel("Electricity per kWh"))
        self.kwh = QDoubleSpinBox()
        self.kwh.setRange(0, 100)
        self.kwh.setDecimals(3)
        self.kwh.setSpecialValueText("not set")
        self.kwh.setToolTip("Owned cards: cost per M tokens = price × measured GPU power (kW) ÷ (tok/s × 3600) × 10⁶")
        row.addWidget(self.kwh)
        price.addLayout(row)
        row = QHBoxLayout()
        row.addWidget(QLabel("Currency"))
        self.currency = QLineEdit("$")
        self.currency.setMaximumWidth(50)
        row.addWidget(self.currency)
        row.addWidget(QLabel("Rows"))
        self.rows_mode = QComboBox()
        self.rows_mode.addItems(["every level", "peak per run"])
        row.addWidget(self.rows_mode)
        price.addLayout(row)
        top.addLayout(price, 2)
        btns = QVBoxLayout()
        self.refresh_btn = QPushButton("Refresh runs")
        self.refresh_btn.clicked.connect(lambda: self.refresh_runs())
        self.png_btn = QPushButton("Export PNG…")
        self.png_btn.setObjectName("compare_png")
        self.png_btn.clicked.connect(self._on_png)
        self.csv_btn = QPushButton("Export CSV…")
        self.csv_btn.setObjectName("compare_csv")
        self.csv_btn.clicked.connect(self._on_csv)
        for b in (self.refresh_btn, self.png_btn, self.csv_btn):
            btns.addWidget(b)
        btns.addStretch(1)
        top.addLayout(btns)
        v.addLayout(top)
        for w in (self.gpu_hour, self.kwh):
            w.valueChanged.connect(lambda *_: self.update_comparison())
        self.currency.editingFinished.connect(self.update_comparison)
        self.rows_mode.currentIndexChanged.connect(lambda *_: self._fill_table())

        # the part that is exported as PNG: message, plots, table
        self.canvas = QWidget()
        cv = QVBoxLayout(self.canvas)
        cv.setContentsMargins(0, 0, 0, 0)
        self.message = QLabel("Tick two or more runs (or select them in History and press Compare selected).")
        self.message.setWordWrap(True)
        cv.addWidget(self.message)
        split = QSplitter(Qt.Vertical)
        self.glw = plot_view(pg.GraphicsLayoutWidget())
        self.glw.setBackground("w")
        a = self.glw.addPlot(row=0, col=0, axisItems={"bottom": Log2Axis("bottom")})
        a.setTitle("Output throughput vs concurrency", size="10pt", color="#222")
        a.setLabel("bottom", "concurrent requests")
        a.setLabel("left", "output tok/s")
        a.showGrid(x=True, y=True, alpha=0.25)
        b = self.glw.addPlot(row=0, col=1, axisItems={"left": PlainLogAxis("left")})
        b.setTitle("TTFT p99 vs throughput", size="10pt", color="#222")
        b.setLabel("bottom", "output tok/s")
        b.setLabel("left", "TTFT p99 (ms, log scale)")
        b.setLogMode(x=False, y=True)
        b.showGrid(x=True, y=True, alpha=0.25)
        self.tput_plot, self.lat_plot = a, b
        # curves rise to the right: the legends go where they are not (top left, bottom right)
        self.legend = add_legend(a, offset=(6, 6), labelTextSize="9pt")
        self.lat_legend = add_legend(b, offset=(-6, -6), labelTextSize="9pt")
        #: … and move to the corner where they cover the fewest points of the curves drawn
        self.legend_places = [LegendPlace(a, self.legend), LegendPlace(b, self.lat_legend)]
        self.legend_fits = [LegendFit(a, self.legend, drive=True), LegendFit(b, self.lat_legend, drive=True)]
        split.addWidget(self.glw)
        # what differs between the runs: model, rig, flags, request shape (app.comparison.settings_diff)
        self.diff_table = QTableWidget(0, 0)
        self.diff_table.setObjectName("compareDiff")
        self.diff_table.verticalHeader().setVisible(False)
        self.diff_table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.diff_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.diff_table.setWordWrap(False)
        split.addWidget(self.diff_table)
        self.table = QTableWidget(0, 0)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.setTextElideMode(Qt.ElideRight)
        self.table.setWordWrap(False)
        split.addWidget(self.table)
        split.addWidget(self._build_whatif())
        split.setSizes([400, 130, 260, 180])
        cv.addWidget(split, 1)
        # at a laptop's height the four panes would get a hundred pixels each: the canvas
        # keeps a readable height and the tab scrolls instead (issue 37, item 7)
        self.canvas.setMinimumHeight(CANVAS_MIN_HEIGHT)
        page = QScrollArea()
        page.setWidgetResizable(True)
        page.setFrameShape(QFrame.NoFrame)
        page.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        page.setWidget(self.canvas)
        self.page = page
        v.addWidget(page, 1)
        self._loaded = False
        self._update_buttons()

    def _build_whatif(self) -> QWidget:
        """The what-if: a measured run's verdict predicted on other cards
        (:func:`app.whatif.what_if`), its rows next to the measured ones."""
        box = QGroupBox("What if — the same model on other cards (predicted from a measured run)")
        w = QVBoxLayout(box)
        row = QHBoxLayout()
        row.addWidget(QLabel("From run"))
        self.whatif_run = QComboBox()
        self.whatif_run.setToolTip("A measured run with an SLO: its model, options, ramp and calibration")
        row.addWidget(self.whatif_run, 2)
        row.addWidget(QLabel("cards"))
        self.whatif_gpu = QComboBox()
        self.whatif_gpu.setEditable(True)
        self.whatif_gpu.addItems(catalog_names())
        self.whatif_gpu.setCurrentText("")
        self.whatif_gpu.setToolTip("Card kind (empty: the run's own)")
        row.addWidget(self.whatif_gpu, 2)
        row.addWidget(QLabel("×"))
        self.whatif_count = QSpinBox()
        self.whatif_count.setRange(1, 64)
        self.whatif_count.setValue(8)
        row.addWidget(self.whatif_count)
        self.whatif_add = QPushButton("Add prediction")
        self.whatif_add.setObjectName("whatif_add")
        self.whatif_add.clicked.connect(self.add_what_if)
        row.addWidget(self.whatif_add)
        self.whatif_clear = QPushButton("Clear")
        self.whatif_clear.clicked.connect(self.clear_what_if)
        row.addWidget(self.whatif_clear)
        w.addLayout(row)
        self.whatif_msg = QLabel("Pick a run and the cards to predict its users at the SLO on.")
        self.whatif_msg.setWordWrap(True)
        w.addWidget(self.whatif_msg)
        self.whatif_table = QTableWidget(0, 0)
        self.whatif_table.verticalHeader().setVisible(False)
        self.whatif_table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.whatif_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        w.addWidget(self.whatif_table, 1)
        self.whatif = None
        self._whatif_targets: list[tuple[str | None, int]] = []
        self._whatif_gen = 0
        self.whatif_thread = None
        return box

    # ------------------------------------------------------------------ what-if
    def add_what_if(self) -> None:
        """Add the chosen cards to the what-if of the chosen run and predict (off the GUI
        thread; the table follows when it is done)."""
        rid = self.whatif_run.currentData()
        if rid is None:
            self.whatif_msg.setText("No run to start from: record a run with an SLO first.")
            return
        if self.whatif is not None and self.whatif.run_id != rid:
            self._whatif_targets = []
        target = (self.whatif_gpu.currentText().strip() or None, self.whatif_count.value())
        if target not in self._whatif_targets:
            self._whatif_targets.append(target)
        self._predict_what_if(rid)

    def clear_what_if(self) -> None:
        self._whatif_gen += 1
        self._whatif_targets = []
        self.whatif = None
        self.whatif_table.setRowCount(0)
        self.whatif_msg.setText("Pick a run and the cards to predict its users at the SLO on.")

    def _predict_what_if(self, rid: int) -> None:
        self._whatif_gen += 1
        gen, targets, pricing, store = self._whatif_gen, list(self._whatif_targets), self.pricing(), self.store_fn()
        rigs = ", ".join(f"{n}× {g or 'its cards'}" for g, n in targets)
        self.whatif_msg.setText(f"Predicting run #{rid} on {rigs}…")
        self.whatif_add.setEnabled(False)

        def done(wi) -> None:
            if gen != self._whatif_gen:
                return
            self.whatif_add.setEnabled(True)
            self.whatif = wi
            acc = wi.accuracy_pct
            self.whatif_msg.setText(
                f"Run #{wi.run_id}: {wi.model} on {wi.rig} at {slo_text(wi.slo)} · parameters {wi.params_source} · "
                + (f"accuracy on the run's levels: output tok/s within ±{acc:.1f} %" if acc is not None else
                   "no level to check the parameters on")
                + " · scaling vs the predicted same-cards row")
            self._fill_whatif()

        def failed(e: BaseException) -> None:
            if gen != self._whatif_gen:
                return
            self.whatif_add.setEnabled(True)
            self.whatif_msg.setText(f"What-if: {e}")

        self.whatif_thread = run_in_background("whatif", lambda: what_if(store, rid, targets, pricing), done, failed)

    def _fill_whatif(self) -> None:
        wi = self.whatif
        cur = wi.currency if wi is not None else "$"
        heads = ["Rig", "Layout", "Users at SLO", "Range", "Out tok/s", "Tok/s per GPU", "Scaling eff.",
                 f"{cur}/M tok (rented)", f"{cur}/M tok (energy)", "Limited by"]
        t = self.whatif_table
        rows = wi.rows if wi is not None else []
        t.setColumnCount(len(heads))
        t.setHorizontalHeaderLabels(heads)
        t.setRowCount(len(rows))
        for r, row in enumerate(rows):
            rng = "" if row.users_low is None or row.users_low == row.users_high else \
                f"{row.users_low:g}–{row.users_high:g}"
            vals = [row.label, row.layout_text, _f(row.users, "g"), rng, _f(row.output_tps, ",.0f"),
                    _f(row.tps_per_gpu, ",.1f"), _f(row.scaling_efficiency, ".2f"),
                    _f(row.cost_per_mtok_rented, ",.3f"), _f(row.cost_per_mtok_energy, ",.3f"),
                    row.limited_by if row.problem is None else f"does not run: {row.problem}"]
            for col, text in enumerate(vals):
                it = QTableWidgetItem(text)
                if row.note:
                    it.setToolTip(row.note)
                if 0 < col < 9:
                    it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                if row.measured:
                    f = it.font()
                    f.setBold(True)
                    it.setFont(f)
                t.setItem(r, col, it)

    def _refresh_whatif_runs(self, runs: list) -> None:
        keep = self.whatif_run.currentData()
        self.whatif_run.blockSignals(True)
        self.whatif_run.clear()
        for r in runs:
            self.whatif_run.addItem(f"#{r.id}  {r.name}", r.id)
        i = self.whatif_run.findData(keep)
        self.whatif_run.setCurrentIndex(i if i >= 0 else 0)
        self.whatif_run.blockSignals(False)

    def showEvent(self, ev) -> None:
        if not self._loaded:
            self.refresh_runs()
        super().showEvent(ev)

    # ------------------------------------------------------------------ runs
    def refresh_runs(self, checked: list[int] | None = None) -> None:
        """List the runs that have levels; tick ``checked`` (default: keep the ticks)."""
        self._loaded = True
        keep = set(checked if checked is not None else self.checked_ids())
        self.runs.blockSignals(True)
        self.runs.clear()
        listed = history.list_runs(self.store_fn())
        self._refresh_whatif_runs(listed)
        for r in listed:
            peak = f"{r.peak_output_tps:,.0f} tok/s" if r.peak_output_tps is not None else "no levels"
            gpus = f"{r.gpu_count} GPU{'s' if r.gpu_count != 1 else ''}, " if r.gpu_count else ""
            it = QListWidgetItem(f"#{r.id}  {r.name}  ({gpus}{peak}, {r.status}, {r.created_text})")
            it.setData(Qt.UserRole, r.id)
            it.setFlags(Qt.ItemIsUserCheckable | Qt.ItemIsEnabled)
            it.setCheckState(Qt.Checked if r.id in keep else Qt.Unchecked)
            self.runs.addItem(it)
        self.runs.blockSignals(False)
        self.update_comparison()

    def checked_ids(self) -> list[int]:
        return [self.runs.item(i).data(Qt.UserRole) for i in range(self.runs.count())
                if self.runs.item(i).checkState() == Qt.Checked]

    def set_runs(self, ids: list[int]) -> None:
        """Compare exactly ``ids`` (ticks them; the list is re-read)."""
        self.refresh_runs(list(ids))

    def set_pricing(self, pricing: Pricing) -> None:
        """Show the prices from Settings (the user may still change them here)."""
        self.gpu_hour.setValue(pricing.gpu_hour or 0)
        self.kwh.setValue(pricing.kwh or 0)
        self.currency.setText(pricing.currency)
        self.update_comparison()

    def pricing(self) -> Pricing:
        return Pricing(gpu_hour=self.gpu_hour.value() or None, kwh=self.kwh.value() or None,
                       currency=self.currency.text().strip() or "$")

    # ------------------------------------------------------------------ comparison
    def update_comparison(self) -> None:
        ids = sorted(self.checked_ids())
        self.comparison = None
        if len(ids) >= 2:
            try:
                self.comparison = compare_runs(self.store_fn(), ids, self.pricing())
            except (ValueError, LookupError) as e:
                self.message.setText(f"Cannot compare: {e}")
        else:
            self.message.setText("Tick two or more runs (or select them in History and press Compare selected).")
        self._draw()
        self._fill_diff()
        self._fill_table()
        self._update_buttons()
        self.compared.emit(self.comparison)

    def _fill_diff(self) -> None:
        """One row per setting that differs; one column per run."""
        t = self.diff_table
        c = self.comparison
        t.clear()
        if c is None:
            t.setRowCount(0)
            t.setColumnCount(0)
            return
        t.setColumnCount(2 + len(c.series))
        t.setHorizontalHeaderLabels(["What differs", "setting"] + [s.label for s in c.series])
        rows = c.diff or [("—", "the runs' settings are the same", [""] * len(c.series))]
        t.setRowCount(len(rows))
        for i, (sec, key, vals) in enumerate(rows):
            for j, text in enumerate([sec, key] + list(vals)):
                it = QTableWidgetItem(text)
                it.setToolTip(text)
                t.setItem(i, j, it)

    def _draw(self) -> None:
        for p in (self.tput_plot, self.lat_plot):
            p.clear()
        self.legend.clear()
        self.lat_legend.clear()
        c = self.comparison
        if c is None:
            return
        curves = c.curves()
        for i, (label, xs, ys) in enumerate(curves["throughput"]):
            pts = [(x, y) for x, y in zip(xs, ys) if x > 0]
            kw = dict(pen=pg.mkPen(COLORS[i % len(COLORS)], width=2), symbol=SYMBOLS[i % len(SYMBOLS)],
                      symbolSize=7, symbolBrush=COLORS[i % len(COLORS)], name=self._label(i, label))
            self.tput_plot.plot(log2([p[0] for p in pts]) if pts else [], [p[1] for p in pts], **kw)
        for i, (label, xs, ys) in enumerate(curves["ttft"]):
            kw = dict(pen=pg.mkPen(COLORS[i % len(COLORS)], width=2), symbol=SYMBOLS[i % len(SYMBOLS)],
                      symbolSize=7, symbolBrush=COLORS[i % len(COLORS)], name=self._label(i, label))
            self.lat_plot.plot(xs, [y * 1000 for y in ys], **kw)
        for fit in self.legend_fits:  # new entries: the largest form that fits, again
            fit.reset()
        base = c.series[c.baseline]
        pr = c.pricing
        prices = []
        if pr.gpu_hour is not None:
            prices.append(f"{pr.currency}{pr.gpu_hour:g}/GPU-hour")
        if pr.kwh is not None:
            prices.append(f"{pr.currency}{pr.kwh:g}/kWh")
        if c.warnings:  # not comparable: say why instead of a meaningless efficiency
            head = (f"<b>{len(c.series)} runs</b> · <span style='color:#b35900'><b>not comparable</b> — no "
                    "scaling efficiency is shown:" + "".join(f"<br>• {html.escape(w)}" for w in c.warnings)
                    + "</span>")
        else:
            head = (f"<b>{len(c.series)} runs</b> · scaling efficiency vs <b>{base.label}</b> ({base.gpus} GPU"
                    f"{'s' if base.gpus != 1 else ''}) at the same level: (tok/s ÷ baseline tok/s) ÷ "
                    "(GPUs ÷ baseline GPUs)")
        self.message.setText(
            head
            + (" · prices: " + ", ".join(prices) if prices else " · enter a price per GPU-hour or per kWh for the "
                                                                 "cost per million output tokens")
            + "".join(f"<br><b>{html.escape(sr.label)}</b>: {html.escape(sr.verdict)}" for sr in c.series
                      if sr.verdict))

    def _label(self, i: int, label: str) -> str:
        """The legend's name of run ``i``: its label cut to :data:`LEGEND_CHARS` (the run
        list and the table give it whole) and its GPUs."""
        s = self.comparison.series[i]
        short = label if len(label) <= LEGEND_CHARS else label[:LEGEND_CHARS - 1].rstrip() + "…"
        return f"{short} ({s.gpus} GPU{'s' if s.gpus != 1 else ''})"

    def table_rows(self) -> list[CompareRow]:
        c = self.comparison
        if c is None:
            return []
        return c.peak_rows() if self.rows_mode.currentIndex() == 1 else c.rows

    def _fill_table(self) -> None:
        cur = self.currency.text().strip() or "$"
        heads = ["Run", "GPUs", "Level", "Out tok/s", "Tok/s per GPU", "Scaling eff.", "TTFT p99 ms",
                 "TPOT p99 ms", "Failures", "Power W", "J/token", f"{cur}/M tok (rented)", f"{cur}/M tok (energy)"]
        rows = self.table_rows()
        t = self.table
        if t.columnCount() != len(heads):
            t.setColumnCount(len(heads))
            t.horizontalHeader().setSectionResizeMode(0, QHeaderView.Interactive)  # run names elide
            t.setColumnWidth(0, 220)
        t.setHorizontalHeaderLabels(heads)
        t.setRowCount(len(rows))
        for r, row in enumerate(rows):
            vals = [row.label, str(row.gpus), f"{row.level:g}", _f(row.output_tps, ",.0f"),
                    _f(row.tps_per_gpu, ",.1f"), _f(row.scaling_efficiency, ".2f"),
                    _f(None if row.ttft_p99 is None else row.ttft_p99 * 1000, ",.0f"),
                    _f(None if row.tpot_p99 is None else row.tpot_p99 * 1000, ",.1f"), f"{row.failure_rate:.1%}",
                    _f(row.power_w, ",.0f"), _f(row.j_per_token, ".3f"), _f(row.cost_per_mtok_rented, ",.3f"),
                    _f(row.cost_per_mtok_energy, ",.3f")]
            for col, text in enumerate(vals):
                it = QTableWidgetItem(text)
                if col == 0:
                    it.setToolTip(text)
                else:
                    it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                t.setItem(r, col, it)

    def _update_buttons(self) -> None:
        ok = self.comparison is not None
        self.png_btn.setEnabled(ok)
        self.csv_btn.setEnabled(ok)

    # ------------------------------------------------------------------ export
    def export_png(self, path: str | Path) -> None:
        """Render the plots and the table to a PNG file. Raises OSError when it cannot be written."""
        if not self.canvas.grab().save(str(path), "PNG"):
            raise OSError(f"cannot write the PNG {path}: check the folder exists and is writable")

    def export_csv(self, path: str | Path) -> None:
        """The comparison table (every level) as CSV (app.comparison.Comparison.to_csv)."""

        if self.comparison is None:
            raise ValueError("nothing to export: tick two or more runs first")
        write_atomic(Path(path), self.comparison.to_csv())

    def _on_png(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export comparison as PNG", "comparison.png", "PNG (*.png)")
        if path:
            try:
                self.export_png(path)
            except OSError as e:
                QMessageBox.warning(self, "Export PNG", str(e))

    def _on_csv(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export comparison as CSV", "comparison.csv", "CSV (*.csv)")
        if path:
            try:
                self.export_csv(path)
            except (OSError, ValueError) as e:
                QMessageBox.warning(self, "Export CSV", str(e))
