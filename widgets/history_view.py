"""Run history: every recorded run (GUI ramps and headless ``vllm-dyno run``/``ramp``)
from the run store — reopen a run's curves and results table, delete it, export it as
JSON or CSV, save its settings as a profile with its results, pick runs to compare.

Presentation only: reading, deleting, exporting and profile-from-run are app.history;
J/token per level is app.comparison's (mean GPU power in the level's window ÷ output
tokens/s). ``store_fn()`` returns the open :class:`app.store.RunStore`.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QHeaderView,
    QInputDialog,
    QLabel,
    QMessageBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from app import history
from app.comparison import load_series
from app.fileio import write_atomic
from app.loadgen.stats import Knee, StepStats
from app.report import run_report
from widgets.button_bar import button_bar
from widgets.results import CurvesView, ResultsTable

RUN_COLUMNS = [h for h, _ in history.RUN_COLUMNS]
NUMERIC_COLUMNS = (5, 6, 7, 8)


def _num(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


class _NumItem(QTableWidgetItem):
    """Sorts by the number in ``Qt.UserRole`` (None first)."""

    def __lt__(self, other: QTableWidgetItem) -> bool:
        a, b = self.data(Qt.UserRole), other.data(Qt.UserRole)
        return (a is not None, a or 0) < (b is not None, b or 0)


class HistoryView(QWidget):
    """Signals: ``compare_requested(list[int])``; ``profile_saved(name)``."""

    compare_requested = Signal(list)
    profile_saved = Signal(str)

    def __init__(self, store_fn: Callable[[], Any], library_fn: Callable[[], Any] | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store_fn = store_fn
        self.library_fn = library_fn
        self.rows: list[history.RunRow] = []
        self.open_run: dict[str, Any] | None = None
        self._power: dict[int, float | None] = {}
        v = QVBoxLayout(self)
        v.setContentsMargins(4, 4, 4, 4)
        bar, self.buttons = button_bar(self, "history", (("refresh", "Refresh", "Read the run store again"),
                               ("open", "Open", "Show the selected run's curves and results table"),
                               ("compare", "Compare selected", "Overlay the selected runs (two or more)"),
                               ("save_profile", "Save as profile…",
                                "Save the run's settings as a profile, with its results"),
                               ("export_json", "Export JSON…", "Everything about the run: levels, requests, "
                                                               "telemetry, server log"),
                               ("export_csv", "Export CSV…", "The run's per-level table"),
                               ("export_html", "Export report…", "One self-contained HTML file: the verdict, the "
                                "flags (vllm serve and --config YAML), rig, levels, curves and telemetry"),
                               ("delete", "Delete", "Delete the selected runs and everything recorded with them")))
        v.addLayout(bar)
        split = QSplitter(Qt.Vertical)
        self.table = QTableWidget(0, len(RUN_COLUMNS))
        self.table.setHorizontalHeaderLabels(RUN_COLUMNS)
        for i, (_, tip) in enumerate(history.RUN_COLUMNS):
            self.table.horizontalHeaderItem(i).setToolTip(tip)
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.ExtendedSelection)
        self.table.setAlternatingRowColors(True)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeToContents)
        hh.setSectionResizeMode(2, QHeaderView.Stretch)
        hh.setSortIndicator(0, Qt.DescendingOrder)  # newest first, and the arrow says so (issue 19, item 7)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.table.itemDoubleClicked.connect(lambda *_: self._on_open())
        split.addWidget(self.table)
        lower = QWidget()
        lv = QVBoxLayout(lower)
        lv.setContentsMargins(0, 0, 0, 0)
        self.run_label = QLabel("Select a run and press Open (or double-click it).")
        self.run_label.setWordWrap(True)
        self.run_label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        lv.addWidget(self.run_label)
        self.detail = QTabWidget()
        self.curves = CurvesView()
        self.results = ResultsTable(self._j_per_token)
        self.results.summary.setText("")
        self.detail.addTab(self.curves, "Curves")
        self.detail.addTab(self.results, "Results")
        lv.addWidget(self.detail, 1)
        split.addWidget(lower)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 2)
        split.setSizes([260, 560])
        v.addWidget(split, 1)
        self._loaded = False
        self._update_buttons()

    def showEvent(self, ev) -> None:  # read the store on first show, not while the window opens
        if not self._loaded:
            self.refresh()
        super().showEvent(ev)

    # ------------------------------------------------------------------ list
    def refresh(self) -> None:
        """Read the run list again (selection kept by run id)."""
        self._loaded = True
        keep = set(self.selected_ids())
        self.rows = history.list_runs(self.store_fn())
        t = self.table
        t.setSortingEnabled(False)
        t.clearSelection()
        t.setRowCount(len(self.rows))
        for r, row in enumerate(self.rows):
            vals = [(f"#{row.id}", row.id), (row.created_text, row.created), (row.name, None), (row.engine, None),
                    (row.status, None), (row.users_text, row.users_at_slo),
                    (history.peak_text(row), row.peak_output_tps),
                    (_num(row.peak_level, "g"), row.peak_level), (_num(row.gpu_count, "d"), row.gpu_count)]
            for c, (text, num) in enumerate(vals):
                it = _NumItem(text) if num is not None or c in NUMERIC_COLUMNS else QTableWidgetItem(text)
                it.setData(Qt.UserRole, num)
                if c == 0:
                    it.setData(Qt.UserRole + 1, row.id)
                if row.verdict:
                    it.setToolTip(row.verdict)
                if c in (0, *NUMERIC_COLUMNS):
                    it.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                if c == 4 and row.status not in ("done", "slo_broken", "stopped"):
                    it.setForeground(Qt.darkRed)
                t.setItem(r, c, it)
        t.setSortingEnabled(True)
        for r in range(t.rowCount()):
            if t.item(r, 0).data(Qt.UserRole + 1) in keep:
                t.selectRow(r)
        self._update_buttons()

    def run_ids(self) -> list[int]:
        """Run ids in the order shown."""
        return [self.table.item(r, 0).data(Qt.UserRole + 1) for r in range(self.table.rowCount())]

    def selected_ids(self) -> list[int]:
        rows = sorted({i.row() for i in self.table.selectedIndexes()})
        return [self.table.item(r, 0).data(Qt.UserRole + 1) for r in rows if self.table.item(r, 0)]

    def select_ids(self, ids: list[int]) -> None:
        self.table.clearSelection()
        mode = self.table.selectionMode()
        self.table.setSelectionMode(QAbstractItemView.MultiSelection)
        for r in range(self.table.rowCount()):
            if self.table.item(r, 0).data(Qt.UserRole + 1) in ids:
                self.table.selectRow(r)
        self.table.setSelectionMode(mode)

    def _update_buttons(self) -> None:
        n = len(self.selected_ids())
        for key in ("open", "save_profile", "export_json", "export_csv", "export_html"):
            self.buttons[key].setEnabled(n == 1)
        self.buttons["delete"].setEnabled(n >= 1)
        self.buttons["compare"].setEnabled(n >= 2)
        self.buttons["save_profile"].setEnabled(n == 1 and self.library_fn is not None)

    # ------------------------------------------------------------------ actions (no dialogs)
    def open(self, run_id: int) -> dict[str, Any]:
        """Show run ``run_id``'s curves, knee and results table; returns the run."""

        store = self.store_fn()
        run = history.get_run(store, run_id)
        steps = [StepStats.model_validate(d) for d in run["levels"]]
        series = load_series(store, [run_id])[0]
        self._power = {d["idx"]: series.power_w.get(d["idx"]) for d in run["levels"]}
        s = run.get("summary") or {}
        knee = Knee.model_validate(s["knee"]) if isinstance(s.get("knee"), dict) else None
        self.open_run = run
        if self.selected_ids() != [run_id]:
            self.select_ids([run_id])
        self.results.clear()
        for st in steps:
            self.results.add_step(st)
        self.curves.set_prediction(None)
        self.curves.set_measured(steps, knee)
        if not steps:
            self.curves.knee_label.setText("This run recorded no completed level.")
        hw = s.get("hardware") or {}
        hw_text = f" · {history.cards_text(hw)}" if hw.get("gpu") else ""
        reason = s.get("stop_reason") or ""
        self.run_label.setText(f"<b>Run #{run_id}</b> {run['name']} · {run['engine']}{hw_text} · "
                               f"<b>{run['status']}</b>{': ' + reason if reason else ''} · {len(steps)} level(s)")
        self.results.summary.setText(f"Run #{run_id}: {run['name']}")
        self.results.set_verdict(s.get("verdict"))
        if s.get("verdict"):
            self.detail.setCurrentWidget(self.results)
        return run

    def delete(self, run_ids: list[int]) -> None:
        store = self.store_fn()
        for rid in run_ids:
            history.delete_run(store, rid)
        if self.open_run is not None and self.open_run["id"] in run_ids:
            self.open_run = None
            self.results.clear()
            self.curves.set_measured([])
            self.run_label.setText("The run shown was deleted.")
        self.refresh()

    def export_json(self, run_id: int, path: str | Path) -> None:
        write_atomic(Path(path), json.dumps(history.export_json(self.store_fn(), run_id), indent=1, default=str))

    def export_csv(self, run_id: int, path: str | Path) -> None:
        write_atomic(Path(path), history.levels_csv(self.store_fn(), run_id))

    def export_html(self, run_id: int, path: str | Path) -> None:
        """The run's HTML report (:func:`app.report.run_report`, as `runs export --format html`)."""
        write_atomic(Path(path), run_report(self.store_fn(), run_id))

    def save_as_profile(self, run_id: int, name: str):
        """The run's settings + results as a profile ``name`` (saved; never overwrites)."""
        prof = history.profile_from_run(self.store_fn(), run_id, name)
        self.library_fn().save(prof, overwrite=False)
        self.profile_saved.emit(prof.name)
        return prof

    def _j_per_token(self, st) -> float | None:
        pw = self._power.get(st.idx)
        return pw / st.output_tps if pw is not None and st.output_tps > 0 else None

    # ------------------------------------------------------------------ buttons
    def _run(self, title: str, fn) -> None:
        try:
            fn()
        except Exception as e:
            QMessageBox.warning(self, title, str(e))

    def _one(self) -> int | None:
        ids = self.selected_ids()
        return ids[0] if len(ids) == 1 else None

    def _on_refresh(self) -> None:
        self._run("Run history", self.refresh)

    def _on_open(self) -> None:
        rid = self._one()
        if rid is not None:
            self._run("Open run", lambda: self.open(rid))

    def _on_compare(self) -> None:
        ids = self.selected_ids()
        if len(ids) >= 2:
            self.compare_requested.emit(sorted(ids))

    def _on_delete(self) -> None:
        ids = self.selected_ids()
        if ids and QMessageBox.question(self, "Delete runs", "Delete run(s) " + ", ".join(f"#{i}" for i in ids)
                                        + " and everything recorded with them?") == QMessageBox.Yes:
            self._run("Delete runs", lambda: self.delete(ids))

    def _export(self, title: str, suffix: str, kind: str, write) -> None:
        """Ask where to save the selected run as ``kind`` (``*.suffix``), then ``write(rid, path)``."""
        rid = self._one()
        if rid is None:
            return
        path, _ = QFileDialog.getSaveFileName(self, title, f"run-{rid}.{suffix}", f"{kind} (*.{suffix})")
        if path:
            self._run(title, lambda: write(rid, path))

    def _on_export_json(self) -> None:
        self._export("Export run as JSON", "json", "JSON", self.export_json)

    def _on_export_csv(self) -> None:
        self._export("Export run as CSV", "csv", "CSV", self.export_csv)

    def _on_export_html(self) -> None:
        self._export("Export the run's report", "html", "HTML", self.export_html)

    def _on_save_profile(self) -> None:
        rid = self._one()
        if rid is None:
            return
        row = next((r for r in self.rows if r.id == rid), None)
        name, ok = QInputDialog.getText(self, "Save run as profile", "Profile name:",
                                        text=f"{row.name} (run {rid})" if row else f"run {rid}")
        if ok and name.strip():
            self._run("Save as profile", lambda: self.save_as_profile(rid, name.strip()))
