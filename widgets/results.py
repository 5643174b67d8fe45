"""The results table (one row per ramp level: StepStats, failure rate, J/token; copyable
as tab-separated text; below it the server's own figures per level from its /metrics,
the client's beside them, and the gap in words) and the curves view (throughput vs concurrency and TTFT p99 vs
throughput; measurement, the plan's prediction overlaid, the knee marked)."""
from __future__ import annotations

import html
import math
from typing import Any, Callable

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app import metrics
from app.loadgen.arrivals import SHORT_FRACTION
from app.loadgen.capacity import answer_text
from app.loadgen.server_stats import SERVER_COLUMNS, SERVER_LEGEND, explain, server_rows, server_summary
from app.loadgen.spec import RampSpec
from app.loadgen.stats import turns_text
from widgets.axes import LegendPlace, add_legend, Log2Axis, PlainLogAxis, log2, place_line
from widgets.fit import plot_view


#: the verdict box above the results table
VERDICT_STYLE = ("#verdict { background:#e8f1fb; border:1px solid #2f6db5; border-radius:4px; padding:8px; "
                 "color:#102a43; }")


def _sent(s: Any) -> str:
    """A rate level's achieved (sent) rate, marked when it fell short of the offered one."""
    a = getattr(s, "achieved_rps", None)
    text = metrics.BY_NAME["achieved_rps"].cell(s)
    why = getattr(s, "rate_short", None)
    if a is None or not why:
        return text
    if a >= SHORT_FRACTION * s.offered_rps:  # sent as offered, completed fewer: requests queued up
        return f"{text} ⚠ server behind"
    return f"{text} ⚠ short ({why})"


def heading(m: metrics.Metric) -> str:
    """A figure's column heading here: its heading, capitalised (``Out tok/s``, ``TTFT p99 ms``)."""
    h = m.heading
    return h[:1].upper() + h[1:]


def columns() -> list[tuple[str, Callable[[Any], str]]]:
    """(header, StepStats → text), one per figure of view RESULTS (app.metrics), in order (the J/token cell
    is filled from ``energy_fn``)."""
    return [(heading(m), _sent if m.name == "achieved_rps" else m.cell) for m in metrics.in_view(metrics.RESULTS)]


#: the figures of the table, in order (app.metrics, view RESULTS; a table reads them when it is made)
FIGURES: list[metrics.Metric] = metrics.in_view(metrics.RESULTS)
COLUMNS = columns()
#: the open-loop columns, shown when a level is a request rate (the Level column is then its offered rate)
RATE_COLUMNS = tuple(heading(m) for m in FIGURES if m.rate)
TURNS_COLUMN = next(i for i, m in enumerate(FIGURES) if m.name == "turns")


class ResultsTable(QWidget):
    """``energy_fn(StepStats) → J/token or None`` fills the J/token column."""

    def __init__(self, energy_fn: Callable[[Any], float | None] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.energy_fn = energy_fn
        self.steps: list[Any] = []
        v = QVBoxLayout(self)
        v.setContentsMargins(4, 4, 4, 4)
        self.verdict = QLabel()
        self.verdict.setObjectName("verdict")
        self.verdict.setWordWrap(True)
        self.verdict.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.verdict.setStyleSheet(VERDICT_STYLE)
        self.verdict.hide()
        v.addWidget(self.verdict)
        top = QHBoxLayout()
        self.summary = QLabel("No ramp yet: launch a server, then Run ramp.")
        self.summary.setWordWrap(True)
        self.summary.setTextInteractionFlags(Qt.TextSelectableByMouse)
        top.addWidget(self.summary, 1)
        self.copy_btn = QPushButton("Copy table")
        self.copy_btn.setToolTip("Copy as tab-separated text (paste into a spreadsheet); Ctrl+C copies the selection")
        self.copy_btn.clicked.connect(lambda: QGuiApplication.clipboard().setText(self.to_tsv()))
        top.addWidget(self.copy_btn)
        v.addLayout(top)
        self.figures = metrics.in_view(metrics.RESULTS)
        self.columns = columns()
        self._col = {m.name: i for i, m in enumerate(self.figures)}
        self.headers = [h for h, _ in self.columns]
        self.table = QTableWidget(0, len(self.headers))
        self.table.setHorizontalHeaderLabels(self.headers)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        v.addWidget(self.table, 1)
        sc = QShortcut(QKeySequence.Copy, self.table)
        sc.activated.connect(self.copy_selection)
        # the server's own figures (StepStats.server): client / server per level, the gap in words
        self.server_label = QLabel("<b>Client vs server</b> — the server's own figures from its /metrics over "
                                   "each level's window")
        self.server_table = QTableWidget(0, len(SERVER_COLUMNS))
        self.server_table.setHorizontalHeaderLabels(list(SERVER_COLUMNS))
        self.server_table.verticalHeader().setVisible(False)
        self.server_table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.server_table.setSelectionBehavior(QTableWidget.SelectRows)
        self.server_table.setAlternatingRowColors(True)
        self.server_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.server_table.horizontalHeader().setStretchLastSection(False)
        self.server_table.setToolTip(SERVER_LEGEND)
        self.server_table.itemSelectionChanged.connect(self._show_notes)
        self.server_notes = QLabel()
        self.server_notes.setWordWrap(True)
        self.server_notes.setTextInteractionFlags(Qt.TextSelectableByMouse)
        for w in (self.server_label, self.server_table, self.server_notes):
            w.hide()
            v.addWidget(w)

    def clear(self) -> None:
        self.steps = []
        self.table.setRowCount(0)
        self.server_table.setRowCount(0)
        for w in (self.server_label, self.server_table, self.server_notes):
            w.hide()
        self.table.horizontalScrollBar().setValue(0)  # the next run's table starts at its first column
        self.set_verdict(None)

    def set_verdict(self, verdict: Any) -> None:
        """Show the run's answer above the table: a :class:`app.run.verdict.Verdict` or its
        stored dict (``sentence``, ``users``, ``next_try``); None hides it."""
        if verdict is None:
            self.verdict.clear()
            self.verdict.hide()
            return
        get = (lambda k: verdict.get(k)) if isinstance(verdict, dict) else (lambda k: getattr(verdict, k, None))
        sentence = get("sentence") or ""
        users = get("users")
        head = answer_text(users, get("mode") or "concurrency", bool(get("indicative")))
        self.verdict.setText(f"<span style='font-size:15pt; font-weight:600'>{html.escape(head)}</span><br>"
                             f"{html.escape(sentence)}")
        self.verdict.show()

    def add_step(self, st: Any) -> None:
        self.steps = [s for s in self.steps if s.idx != st.idx] + [st]
        self.steps.sort(key=lambda s: s.idx)
        self._fill()

    def refresh_energy(self) -> None:
        self._fill()

    def _fill(self) -> None:
        self.table.setRowCount(len(self.steps))
        rate = any(getattr(st, "mode", "") == "rate" for st in self.steps)
        for col, m in enumerate(self.figures):
            if m.rate:
                self.table.setColumnHidden(col, not rate)
        self.table.horizontalHeaderItem(0).setText("Level (offered)" if rate else "Level")
        numeric = [m.name not in ("slo_broken", "stop_reason", "turns") for m in self.figures]
        col_of = self._col
        for row, st in enumerate(self.steps):
            vals = [fn(st) for _, fn in self.columns]
            if st.mode == "rate":
                vals[col_of["level"]] += " req/s"
            j = self.energy_fn(st) if self.energy_fn else None
            vals[col_of["energy_j_per_token"]] = metrics.BY_NAME["energy_j_per_token"].format(j)
            for col, text in enumerate(vals):
                it = QTableWidgetItem(text)
                if not st.steady:  # the figures of a start-up transient: say so on the whole row
                    it.setToolTip(st.unsteady_reason)
                    if col == col_of["stop_reason"]:
                        it.setForeground(Qt.darkYellow)
                if numeric[col]:
                    it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                if col == col_of["slo_broken"] and not st.slo_met:
                    it.setForeground(Qt.red)
                if col == col_of["achieved_rps"] and getattr(st, "rate_short", None):  # achieved < 95 % of offered
                    it.setForeground(Qt.red if st.rate_short != "draw" else Qt.darkYellow)
                    it.setToolTip(st.rate_note)
                if col == col_of["turns"] and getattr(st, "turns", None):
                    it.setToolTip("TTFT p50/p99 by conversation turn: " + turns_text(st.turns))
                self.table.setItem(row, col, it)
        self._fill_server()

    def _fill_server(self) -> None:
        """The server table: one row per level with server figures, each row's tooltip
        the gap in words; under it the notes of the selected level (else the last)."""
        with_server = [st for st in self.steps if getattr(st, "server", None) is not None]
        rows = server_rows(with_server)
        self.server_table.setRowCount(len(rows))
        for r, (st, vals) in enumerate(zip(with_server, rows)):
            tip = "\n".join(st.server.notes or explain(st))
            for c, text in enumerate(vals):
                it = QTableWidgetItem(text)
                it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                it.setToolTip(tip)
                self.server_table.setItem(r, c, it)
        if rows:  # as tall as its rows (up to 6; then it scrolls)
            h = self.server_table.horizontalHeader().height() + 2 * self.server_table.frameWidth()
            h += sum(self.server_table.rowHeight(i) for i in range(min(len(rows), 6)))
            self.server_table.setFixedHeight(h + (self.server_table.horizontalScrollBar().sizeHint().height()))
        self.server_table.setVisible(bool(rows))
        self._show_notes()
        self.server_label.setVisible(bool(rows) or not self.server_notes.isHidden())

    def _show_notes(self) -> None:
        with_server = [st for st in self.steps if getattr(st, "server", None) is not None]
        said = server_summary(self.steps) if self.steps else []
        sel = sorted({i.row() for i in self.server_table.selectedIndexes()})
        st = with_server[sel[0]] if sel and sel[0] < len(with_server) else (with_server[-1] if with_server else None)
        parts = []
        if st is not None:
            lvl = f"{st.level:g}" + ("/s" if st.mode == "rate" else "")
            parts.append(f"<b>Level {lvl}</b>: " + "<br>".join(html.escape(n) for n in (st.server.notes or explain(st))))
            parts.append(f"<span style='color:#555'>{html.escape(SERVER_LEGEND)}</span>")
        parts += [f"<span style='color:#8a5a00'>{html.escape(x)}</span>" for x in said]
        self.server_notes.setText("<br>".join(parts))
        self.server_notes.setVisible(bool(parts))

    def to_tsv(self, rows: list[int] | None = None) -> str:
        rows = range(self.table.rowCount()) if rows is None else rows
        cols = [c for c in range(self.table.columnCount()) if not self.table.isColumnHidden(c)]
        out = ["\t".join(self.table.horizontalHeaderItem(c).text() for c in cols)]
        for r in rows:
            out.append("\t".join((self.table.item(r, c).text() if self.table.item(r, c) else "")
                                 for c in cols))
        return "\n".join(out)

    def copy_selection(self) -> None:
        rows = sorted({i.row() for i in self.table.selectedIndexes()})
        QGuiApplication.clipboard().setText(self.to_tsv(rows or None))


class CurvesView(QWidget):
    """Measured points per level, the plan's predicted curve (dashed) and the knee."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        v = QVBoxLayout(self)
        v.setContentsMargins(4, 4, 4, 4)
        self.knee_label = QLabel("The knee is the last level where more users still buy throughput; it is "
                                 "marked once a ramp has run past it.")
        self.knee_label.setWordWrap(True)
        self.knee_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        v.addWidget(self.knee_label)
        self.glw = plot_view(pg.GraphicsLayoutWidget())
        v.addWidget(self.glw, 1)
        a = self.glw.addPlot(row=0, col=0, axisItems={"bottom": Log2Axis("bottom")})
        a.setTitle("Throughput vs concurrency", size="10pt")
        a.setLabel("bottom", "concurrent requests")
        a.setLabel("left", "output tok/s")
        a.showGrid(x=True, y=True, alpha=0.25)
        add_legend(a, offset=(-6, -6), labelTextSize="9pt")
        b = self.glw.addPlot(row=0, col=1, axisItems={"left": PlainLogAxis("left")})
        b.setTitle("TTFT p99 vs throughput", size="10pt")
        b.setLabel("bottom", "output tok/s")
        b.setLabel("left", "TTFT p99 (ms, log scale)")
        b.setLogMode(x=False, y=True)
        b.showGrid(x=True, y=True, alpha=0.25)
        add_legend(b, offset=(6, 6), labelTextSize="9pt")
        self.tput_plot, self.lat_plot = a, b
        #: each legend goes to the corner where it covers the fewest points of the curves
        self.legend_places = [LegendPlace(p, p.legend) for p in (a, b)]
        meas = dict(pen=pg.mkPen("#1f77b4", width=2), symbol="o", symbolSize=7, symbolBrush="#1f77b4")
        pred = dict(pen=pg.mkPen("#ff7f0e", width=2, style=Qt.DashLine), symbol="t", symbolSize=6,
                    symbolBrush="#ff7f0e")
        self.meas_tput = a.plot([], [], name="measured", **meas)
        self.pred_tput = a.plot([], [], name="predicted (plan)", **pred)
        self.meas_lat = b.plot([], [], name="measured", **meas)
        self.pred_lat = b.plot([], [], name="predicted (plan)", **pred)
        self.knee_line = pg.InfiniteLine(angle=90, pen=pg.mkPen("#d62728", width=2),
                                         label="knee {value:.0f}", labelOpts={"position": 0.12, "color": "#d62728"})
        self.pred_knee_line = pg.InfiniteLine(angle=90, pen=pg.mkPen("#ff7f0e", width=1, style=Qt.DotLine),
                                              label="predicted knee", labelOpts={"position": 0.25,
                                                                                 "color": "#ff7f0e"})
        a.addItem(self.knee_line, ignoreBounds=True)
        a.addItem(self.pred_knee_line, ignoreBounds=True)
        self.knee_point = b.plot([], [], pen=None, symbol="star", symbolSize=18, symbolBrush="#d62728",
                                 name="knee")
        self.knee_line.hide()
        self.pred_knee_line.hide()
        self.rate = False  # the x axis: concurrency (closed loop) or the offered rate (open loop)
        self._has_prediction = False
        self._legend_entries = {self.pred_tput: (a, "predicted (plan)"), self.pred_lat: (b, "predicted (plan)"),
                                self.knee_point: (b, "knee")}
        for item in self._legend_entries:
            self._show_in_legend(item, False)

    def _show_in_legend(self, item, show: bool) -> None:
        """A legend lists only what is drawn (no "predicted" entry for a run without a plan)."""
        plot, name = self._legend_entries[item]
        listed = any(sample.item is item for sample, _ in plot.legend.items)
        if show and not listed:
            plot.legend.addItem(item, name)
        elif not show and listed:
            plot.legend.removeItem(item)

    def _set_axis(self, rate: bool) -> None:
        """Closed loop: throughput against concurrent requests, with the plan's predicted
        (closed-loop) curve; open loop: against the offered request rate (req/s), without it
        — the plan predicts users, not rates."""
        if rate == self.rate:
            return
        self.rate = rate
        a = self.tput_plot
        a.setTitle("Throughput vs request rate" if rate else "Throughput vs concurrency", size="10pt")
        a.setLabel("bottom", "offered request rate (req/s)" if rate else "concurrent requests")
        for item in (self.pred_tput, self.pred_lat):
            item.setVisible(not rate)
            self._show_in_legend(item, not rate and self._has_prediction)
        if rate:
            self.pred_knee_line.hide()
        elif self._has_prediction:
            self.pred_knee_line.show()

    def set_prediction(self, curve: Any | None) -> None:
        """``curve``: app.engine.steptime.Curve or None (drawn while the ramp is closed loop)."""
        self._has_prediction = curve is not None
        self._show_in_legend(self.pred_tput, curve is not None and not self.rate)
        self._show_in_legend(self.pred_lat, curve is not None and not self.rate)
        if curve is None:
            self.pred_tput.setData([], [])
            self.pred_lat.setData([], [])
            self.pred_knee_line.hide()
            return
        xs = [p.concurrency for p in curve.points]
        self.pred_tput.setData(log2(xs), [p.output_tps for p in curve.points])
        lat = [p for p in curve.points if p.ttft_p99_s is not None]  # the p99, as measured
        self.pred_lat.setData([p.output_tps for p in lat], [p.ttft_p99_s * 1000 for p in lat])
        place_line(self.pred_knee_line, math.log2(max(1, curve.knee)), f"predicted knee {curve.knee}")
        if self.rate:  # kept for when the ramp is closed loop again
            self.pred_knee_line.hide()

    def set_measured(self, steps: list[Any], knee: Any | None = None, spec: Any | None = None) -> None:
        """``steps``: StepStats list; ``knee``: app.loadgen.stats.Knee or None; ``spec``:
        the ramp's RampSpec, whose knee rule (``knee_gain``, ``knee_ttft_ratio``) is quoted
        while no knee is found (the spec's defaults without one)."""
        rate = any(getattr(s, "mode", "") == "rate" for s in steps) or (spec is not None and spec.mode == "rate")
        self._set_axis(rate)
        ok = sorted((s for s in steps if s.n_ok and s.output_tps > 0), key=lambda s: s.level)
        self.meas_tput.setData(log2([s.level for s in ok]), [s.output_tps for s in ok])
        lat = [s for s in ok if s.ttft_p99]
        self.meas_lat.setData([s.output_tps for s in lat], [s.ttft_p99 * 1000 for s in lat])
        self._show_in_legend(self.knee_point, knee is not None)
        if knee is not None:
            place_line(self.knee_line, math.log2(knee.level), f"knee {knee.level:g}")
            self.knee_point.setData([knee.output_tps], [knee.ttft_p99 * 1000])
            unit = "req/s" if rate else "concurrent requests"
            self.knee_label.setText(f"<b>Knee at {knee.level:g} {unit}</b> — going from "
                                    f"{knee.level:g} to {knee.next_level:g} gains {knee.gain_per_doubling:.0%} "
                                    f"throughput per doubling ({knee.output_tps:,.0f} → {knee.next_output_tps:,.0f} "
                                    f"tok/s) while TTFT p99 grows {knee.ttft_ratio:.1f}× ({knee.ttft_p99 * 1e3:,.0f}"
                                    f" → {knee.next_ttft_p99 * 1e3:,.0f} ms).")
        else:
            self.knee_line.hide()
            self.knee_point.setData([], [])
            if ok:
                if spec is None:
                    fields = RampSpec.model_fields
                    gain, ratio = fields["knee_gain"].default, fields["knee_ttft_ratio"].default
                else:
                    gain, ratio = spec.knee_gain, spec.knee_ttft_ratio
                self.knee_label.setText(f"{len(ok)} level(s) measured; no knee yet (throughput still grows "
                                        f"≥ {gain:.0%} per doubling, or TTFT p99 grew < {ratio:g}×).")
