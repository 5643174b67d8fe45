"""Axis helpers for pyqtgraph: a base-2 log axis whose ticks read 1, 2, 4, 8 …, a plain
log axis, and a clock axis for session time."""
from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QTimer

from app.clock import clock_text, clock_ticks


def log2(values) -> np.ndarray:
    """Data → axis coordinates for :class:`Log2Axis` (values must be > 0)."""
    return np.log2(np.asarray(values, dtype=float))


class Log2Axis(pg.AxisItem):
    """Plot ``log2(x)``; ticks at whole powers of two labelled with the plain value."""

    def tickValues(self, minVal, maxVal, size):
        lo, hi = math.floor(min(minVal, maxVal)), math.ceil(max(minVal, maxVal))
        step = max(1, math.ceil((hi - lo + 1) / 12))
        return [(step, [float(v) for v in range(lo, hi + 1, step)])]

    def tickStrings(self, values, scale, spacing):
        return [f"{2 ** v:g}" for v in values]


class ClockAxis(pg.AxisItem):
    """A time axis in seconds labelled as a clock reads (``0:30``, ``17:00``, ``1:02:00``)
    at clock-like steps (app.clock.clock_ticks): never pyqtgraph's SI prefix ("ks")."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.enableAutoSIPrefix(False)

    def tickValues(self, minVal, maxVal, size):
        step, values = clock_ticks(minVal, maxVal, max(2, int(size // 70)))
        return [(step, values)]

    def tickStrings(self, values, scale, spacing):
        return [clock_text(v) for v in values]


class PlainLogAxis(pg.AxisItem):
    """An axis for ``setLogMode(..., True)`` whose labels read 50, 100, 200, 500 … (plain
    numbers, only at 1-2-5 steps) instead of pyqtgraph's ``5·10¹`` form."""

    def logTickStrings(self, values, scale, spacing):
        out = []
        for v in values:
            x = 10 ** float(v) * scale
            mant = x / 10 ** math.floor(math.log10(x)) if x > 0 else 0
            out.append(f"{x:,.10g}" if any(abs(mant - m) < 1e-6 for m in (1, 2, 5)) else "")
        return out


def nice_step(raw: float) -> float:
    """The smallest 1-2-5 × 10^k step ≥ ``raw`` (> 0): 0.3 → 0.5, 7 → 10, 120 → 200."""
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)


def place_line(line: pg.InfiniteLine, value: float, text: str) -> None:
    """Show ``line`` at ``value`` with label ``text`` (a hidden line's label would not update)."""
    line.show()
    line.setValue(value)
    if line.label is not None:
        line.label.setFormat(text.replace("{", "{{").replace("}", "}}"))


#: the most of its plot's area a legend may cover (issue 19, item 9)
LEGEND_SHARE = 0.25
#: the label sizes a legend tries, largest first, before it gives up its place
LEGEND_SIZES = ("8pt", "7pt", "6pt")
#: ms between a self-driven legend's fitting steps (Qt lays the legend out in between)
LEGEND_STEP_MS = 40


def legend_share(plot, legend) -> float:
    """The part of ``plot``'s view box (a pyqtgraph PlotItem) that ``legend`` covers."""
    area = plot.vb.sceneBoundingRect()
    r = legend.sceneBoundingRect().intersected(area)
    return r.width() * r.height() / max(1.0, area.width() * area.height())


class LegendFit:
    """Keeps a pyqtgraph legend within ``share`` of its plot's view box (issue 19, item 9).

    Label sizes take effect only once Qt has laid the legend out again, so the fit is
    measured, not predicted: :meth:`reset` (the view box changed size) goes back to the
    largest form — ``columns`` columns at the first of :data:`LEGEND_SIZES` — and each
    :meth:`step` (the dashboard's redraw tick) measures the legend as drawn and, while it
    covers more than ``share`` or does not fit inside the plot, takes the next smaller
    form: smaller labels, then twice the columns, then all entries in one row, then
    hidden (a plot smaller than its legend shows the data)."""

    def __init__(self, plot, legend, share: float = LEGEND_SHARE, columns: int = 1, drive: bool = False) -> None:
        self.plot, self.legend, self.share = plot, legend, share
        # then twice the columns (a tall key beside a short plot), before one row
        self.forms = [(columns, s) for s in LEGEND_SIZES] + [(2 * columns, s) for s in LEGEND_SIZES]
        self.idx = 0
        #: ``drive``: step itself (a short timer chain after each reset) instead of
        #: waiting for the owner's redraw ticks
        self.drive = drive
        plot.vb.sigResized.connect(lambda *_: self.reset())

    def _apply(self) -> None:
        leg = self.legend
        if self.idx >= len(self.forms) + len(LEGEND_SIZES):
            leg.hide()
            return
        cols, size = (self.forms[self.idx] if self.idx < len(self.forms)
                      else (max(1, len(leg.items)), LEGEND_SIZES[self.idx - len(self.forms)]))
        leg.show()
        if leg.columnCount != cols:
            leg.setColumnCount(cols)
        if leg.labelTextSize() != size:
            leg.setLabelTextSize(size)  # sets the labels' size attribute only: render them again
            for _, label in leg.items:
                label.setText(label.text)
                label.updateGeometry()  # its size hint follows the smaller text
            leg.layout.invalidate()

    def reset(self) -> None:
        """Back to the largest form (the plot or the entries changed)."""
        self.idx = 0
        self._apply()
        if self.drive:
            QTimer.singleShot(LEGEND_STEP_MS, self.legend, self._drive)

    def _drive(self) -> None:
        if not self.step():
            QTimer.singleShot(LEGEND_STEP_MS, self.legend, self._drive)

    def step(self) -> bool:
        """One measurement; True when the legend now fits (or has nothing to show)."""
        if not self.legend.items or not self.legend.isVisible():
            return True
        self.legend.layout.activate()  # the labels' new sizes into the legend's layout …
        self.legend.updateSize()  # … and the legend's own size from it
        area = self.plot.vb.sceneBoundingRect()
        r = self.legend.sceneBoundingRect()
        inside = r.width() <= area.width() and r.height() <= area.height()  # wider than its plot: cut off
        if inside and legend_share(self.plot, self.legend) <= self.share:
            return True
        self.idx += 1
        self._apply()
        return False


#: a legend's places, in the order tried on a tie: (x, y) offsets from the view box's corner,
#: px (pyqtgraph's LegendItem.setOffset: negative = from the right / bottom)
LEGEND_CORNERS = ((6, 6), (-6, 6), (-6, -6), (6, -6))
#: points sampled along each segment of a curve when counting what a legend covers
SEGMENT_SAMPLES = 8


def plotted_points(plot) -> np.ndarray:
    """``(n, 2)`` view coordinates of what ``plot`` (a PlotItem) draws: every visible data
    point and, for a curve drawn with a pen, :data:`SEGMENT_SAMPLES` points along each of
    its segments (a line under a legend is covered too)."""
    out = []
    for item in plot.listDataItems():
        if not item.isVisible():
            continue
        x, y = item.getData()
        if x is None or y is None or len(x) == 0:
            continue
        xy = np.column_stack([np.asarray(x, dtype=float), np.asarray(y, dtype=float)])
        xy = xy[np.isfinite(xy).all(axis=1)]
        out.append(xy)
        pen = getattr(item, "opts", {}).get("pen")
        if len(xy) > 1 and pen is not None and isinstance(item, pg.PlotDataItem):
            t = np.linspace(0.0, 1.0, SEGMENT_SAMPLES, endpoint=False)[1:, None, None]
            seg = xy[:-1] + t * (xy[1:] - xy[:-1])  # (samples, segments, 2)
            out.append(seg.reshape(-1, 2))
    return np.concatenate(out) if out else np.zeros((0, 2))


class LegendPlace:
    """Moves a legend to the corner of its plot's view box where it covers the fewest
    drawn points (:func:`plotted_points`), each time the view's range or size changes —
    new data, autorange, a zoom (issue 37: legends covered curves in Compare, Curves and
    the Pareto plot). A tie keeps the current corner, then takes the first of
    :data:`LEGEND_CORNERS`."""

    def __init__(self, plot, legend) -> None:
        self.plot, self.legend = plot, legend
        self._queued = False
        plot.vb.sigRangeChanged.connect(self._queue)
        plot.vb.sigResized.connect(self._queue)

    def _queue(self, *_) -> None:
        """Place the legend once the event loop is back, not inside the signal: range
        changes come in bursts (each curve added, autorange, a resize) and a placement
        measures every drawn point, so a burst places it once; the call's context is the
        legend, so a legend deleted meanwhile (its window closed) never gets it."""
        if not self._queued:
            self._queued = True
            QTimer.singleShot(0, self.legend, self._place_queued)

    def _place_queued(self) -> None:
        self._queued = False
        self.place()

    def covered(self, offset) -> int:
        """How many drawn points the legend would cover at corner ``offset``."""
        vb, leg = self.plot.vb, self.legend
        area = vb.sceneBoundingRect()
        r = leg.sceneBoundingRect()
        w, h = r.width(), r.height()
        ox, oy = offset
        left = area.left() + ox if ox > 0 else area.right() + ox - w
        top = area.top() + oy if oy > 0 else area.bottom() + oy - h
        a = vb.mapSceneToView(QPointF(left, top))
        b = vb.mapSceneToView(QPointF(left + w, top + h))
        pts = plotted_points(self.plot)
        if not len(pts):
            return 0
        x0, x1 = sorted((a.x(), b.x()))
        y0, y1 = sorted((a.y(), b.y()))
        inside = (pts[:, 0] >= x0) & (pts[:, 0] <= x1) & (pts[:, 1] >= y0) & (pts[:, 1] <= y1)
        return int(inside.sum())

    def place(self) -> tuple[int, int] | None:
        """Put the legend where it covers least; returns the corner's offset (None: no
        legend entries, or the legend is hidden)."""
        leg = self.legend
        if not leg.items or not leg.isVisible():
            return None
        off = leg.opts.get("offset")
        now = (int(off[0]), int(off[1])) if off is not None else None
        order = sorted(LEGEND_CORNERS, key=lambda c: c != now)  # the current corner first: a tie keeps it
        best = min(order, key=self.covered)
        if best != now:
            leg.setOffset(best)
        return best


class KeptLegend(pg.LegendItem):
    """pyqtgraph's legend, keeping every entry it takes out (``removeItem``, ``clear``)
    alive as long as itself. Under PySide a removed entry (its ItemSample and LabelItem,
    out of the legend's layout and scene) belongs to Python alone, so the garbage collector
    freed it at a moment of its choosing; deleting a closed window then crashed Qt on a
    freed item in a plot's layout (SIGSEGV in ~QGraphicsWidget under QGraphicsScene::clear;
    none in 4 × 120 tests with the entries kept). A mitigation measured by experiment, not
    a cause read in Qt's source: CI still crashed with it until the test windows were
    deleted in their own test's teardown (tests/plugins/qt.py). Made by :func:`add_legend`."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        #: the entries taken out: ``(ItemSample, LabelItem)``, hidden, out of the scene
        self.removed: list = []

    def removeItem(self, item) -> None:  # noqa: N802 (pyqtgraph's name)
        self.removed.extend((s, lb) for s, lb in self.items if s.item is item or lb.text == item)
        super().removeItem(item)

    def clear(self) -> None:
        self.removed.extend(self.items)
        super().clear()


def add_legend(plot, **kwargs) -> KeptLegend:
    """``plot.addLegend(**kwargs)`` (a pyqtgraph PlotItem) with a :class:`KeptLegend`: the
    legend goes on the plot's view box and becomes ``plot.legend``, so the plot adds its
    named curves to it as pyqtgraph's own would (pyqtgraph 0.14 PlotItem.addLegend)."""
    legend = KeptLegend(**kwargs)
    legend.setParentItem(plot.vb)
    plot.legend = legend
    return legend
