"""The Live tab's Hosts table (issue 21, item 2): one row per host of a rig — its label,
role and rank, its server part's state, its cards (the agent's hello), its clock offset
against the session clock with the bound and the round trip of the exchange that
measured it (ms), and after a failure or a loss the reason, in red.

Presentation only: the rows are :meth:`app.run.controller.RunController.rig_status`'s
plain dicts (or the selected profile's hosts before a launch, state ``not launched``);
the window shows the view only for two or more hosts."""

from __future__ import annotations

import collections
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QAbstractItemView, QHeaderView, QLabel, QSizePolicy, QTableWidget, QTableWidgetItem,
                               QVBoxLayout, QWidget)

COLUMNS = ("Host", "Role", "State", "Cards", "Clock offset", "Round trip", "Reason")
REASON_COLOR = "#a61b1b"


def cards_text(row: dict[str, Any]) -> str:
    """``2 × NVIDIA H100``, ``1 × A, 1 × B`` (the hello's card names, grouped in order),
    ``CPU`` for a host without cards, ``""`` before its agent's hello."""
    if not row.get("hostname"):
        return ""
    names = collections.Counter(row.get("cards") or [])
    return ", ".join(f"{n} × {name}" for name, n in names.items()) or "CPU"


def role_text(row: dict[str, Any]) -> str:
    """``head, rank 0`` / ``headless, rank 1``; ``—`` before the launch plan."""
    if not row.get("role"):
        return "—"
    return f"{row['role']}, rank {row['rank']}" if row.get("rank") is not None else row["role"]


def offset_text(row: dict[str, Any]) -> tuple[str, str]:
    """(``+0.012 ± 0.031 ms``, ``0.062 ms``): offset ± bound and round trip, in ms."""
    if row.get("offset_s") is None:
        return "", ""
    return (f"{row['offset_s'] * 1e3:+.3f} ± {row['bound_s'] * 1e3:.3f} ms", f"{row['rtt_s'] * 1e3:.3f} ms")


class HostsView(QWidget):
    """``state_colors``: state name → CSS colour (the window's status-bar colours)."""

    def __init__(self, state_colors: dict[str, str] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state_colors = dict(state_colors or {})
        self.rows: list[dict[str, Any]] = []
        v = QVBoxLayout(self)
        v.setContentsMargins(0, 0, 0, 4)
        v.setSpacing(2)
        self.title = QLabel("<b>Hosts</b> — every host's telemetry on this session's clock")
        v.addWidget(self.title)
        t = QTableWidget(0, len(COLUMNS))
        t.setObjectName("hostsTable")
        t.setHorizontalHeaderLabels(COLUMNS)
        t.verticalHeader().hide()
        t.setEditTriggers(QAbstractItemView.NoEditTriggers)
        t.setSelectionMode(QAbstractItemView.NoSelection)
        t.setFocusPolicy(Qt.NoFocus)
        hh = t.horizontalHeader()
        for i in range(len(COLUMNS) - 1):
            hh.setSectionResizeMode(i, QHeaderView.ResizeToContents)
        hh.setStretchLastSection(True)
        self.table = t
        v.addWidget(t)
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Fixed)  # its rows' height: the plots keep the rest

    def set_rows(self, rows: list[dict[str, Any]]) -> None:
        """Show ``rows`` (rig_status's dicts); redraws only when they changed."""
        if rows == self.rows:
            return
        self.rows = [dict(r) for r in rows]
        t = self.table
        t.setRowCount(len(rows))
        for i, r in enumerate(rows):
            off, rtt = offset_text(r)
            texts = (r["host"], role_text(r), r["state"], cards_text(r), off, rtt, r.get("reason") or "")
            for j, text in enumerate(texts):
                item = QTableWidgetItem(text)
                if j == 2 and r["state"] in self.state_colors:
                    item.setForeground(QBrush(QColor(self.state_colors[r["state"]])))
                if j == len(texts) - 1 and text:
                    item.setForeground(QBrush(QColor(REASON_COLOR)))
                    item.setToolTip(text)
                if j == 0 and r.get("hostname"):
                    item.setToolTip(f"hostname {r['hostname']}")
                if j == 4 and r.get("drift_ppm") is not None:
                    item.setToolTip(f"clock drift {r['drift_ppm']:+.1f} ppm against this machine's")
                t.setItem(i, j, item)
        # as tall as its rows: the plots below keep the rest
        h = t.horizontalHeader().height() + sum(t.rowHeight(i) for i in range(len(rows))) + 2 * t.frameWidth()
        t.setFixedHeight(h)

    def cell(self, row: int, col: str) -> str:
        """The text shown in ``row``, column ``col`` (one of COLUMNS)."""
        item = self.table.item(row, COLUMNS.index(col))
        return item.text() if item is not None else ""
