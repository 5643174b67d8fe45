"""The prompt and output length histograms of a dataset ramp, in the Ramp form: two small
bar plots (tokens on x, requests on y) and one line of mean/p50/p90/max each, from
:func:`app.loadgen.prompts.dataset_lengths` (the lengths the ramp will send)."""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtWidgets import QHBoxLayout, QLabel, QVBoxLayout, QWidget

from widgets.fit import plot_view

#: bar colours: the prompt (blue) and the output (orange)
COLORS = {"prompt": "#3a6ea5", "output": "#d9822b"}


class LengthHistogram(QWidget):
    """Shows :meth:`show_lengths`' histograms; :meth:`show_error` a dataset that cannot
    be read; hidden with no dataset (:meth:`clear`)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        v = QVBoxLayout(self)
        v.setContentsMargins(0, 0, 0, 0)
        v.setSpacing(2)
        self.caption = QLabel()
        self.caption.setWordWrap(True)
        v.addWidget(self.caption)
        row = QHBoxLayout()
        row.setSpacing(4)
        self.plots: dict[str, pg.PlotWidget] = {}
        for name in ("prompt", "output"):
            p = plot_view(pg.PlotWidget(background="w"))
            p.setFixedHeight(110)
            p.setMinimumWidth(120)
            p.setMenuEnabled(False)
            p.setMouseEnabled(x=False, y=False)
            p.hideButtons()
            p.setTitle(f"{name} tokens", size="8pt")
            p.getAxis("left").setStyle(tickTextWidth=24, autoExpandTextSpace=False)
            p.getAxis("left").setWidth(28)
            for ax in ("left", "bottom"):
                p.getAxis(ax).setStyle(tickFont=self.font())
            self.plots[name] = p
            row.addWidget(p, 1)
        v.addLayout(row)
        self.stats = QLabel()
        self.stats.setWordWrap(True)
        v.addWidget(self.stats)
        self.lengths: dict | None = None
        self.setVisible(False)

    def show_lengths(self, lengths: dict, name: str) -> None:
        """``lengths``: :func:`app.loadgen.prompts.dataset_lengths`; ``name``: the source as shown."""
        self.lengths = lengths
        skipped = f", {lengths['skipped']} without a prompt skipped" if lengths.get("skipped") else ""
        cut = " (the first of a larger file)" if lengths.get("truncated") else ""
        self.caption.setText(f"{name}: {lengths['entries']} entries ({lengths['format']}{skipped}){cut}; "
                             f"the first {lengths['prompt']['n']} requests:")
        self.caption.setStyleSheet("")
        lines = []
        for key, plot in self.plots.items():
            h = lengths[key]
            plot.clear()
            edges, counts = h["edges"], h["counts"]
            width = edges[1] - edges[0]
            plot.addItem(pg.BarGraphItem(x0=edges[:-1], width=width, height=counts, brush=COLORS[key],
                                         pen=pg.mkPen(COLORS[key])))
            plot.setXRange(0, edges[-1], padding=0.02)
            plot.setYRange(0, max(counts) or 1, padding=0.05)
            plot.setVisible(True)
            lines.append(f"{key}: mean {h['mean']:.0f}, p50 {h['p50']}, p90 {h['p90']}, max {h['max']}")
        self.stats.setText("\n".join(lines))
        self.setVisible(True)

    def show_error(self, text: str) -> None:
        self.lengths = None
        self.caption.setText(text)
        self.caption.setStyleSheet("color: #a61b1b")
        self.stats.setText("")
        for p in self.plots.values():
            p.setVisible(False)
        self.setVisible(True)

    def clear(self) -> None:
        self.lengths = None
        self.setVisible(False)
