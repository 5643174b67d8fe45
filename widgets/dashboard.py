"""The live dashboard: six pyqtgraph plots on the session clock, level boundaries marked.

Throughput (client output tok/s, concurrency level as a step line on a second axis),
latency (TTFT and TPOT p50/p99, ms), VRAM per GPU (GiB, total dashed) with the
server's KV-cache usage (%) on a second axis, temperature per GPU (°C, slowdown
threshold dashed), power per GPU (W), running and waiting requests. Data come from
ring buffers (:class:`app.telemetry.series.SeriesBank` and
:class:`app.loadgen.live.ClientSeries`); a QTimer redraws at ≤ 20 Hz with
clip-to-view and peak downsampling; unchanged series are not redrawn.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QGraphicsItem
from PySide6.QtWidgets import QVBoxLayout, QWidget

from app.loadgen.live import BIN_S, SMOOTH_S
from app.telemetry import names
from widgets.fit import plot_view
from widgets.plot_export import export_plot
from widgets.axes import ClockAxis, add_legend, LegendFit, PlainLogAxis, nice_step, place_line

GIB = 2**30
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
           "#7f7f7f", "#bcbd22", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"]

#: the telemetry plots the redraw timer updates in turn, one per frame
TELEMETRY_TURNS = ("vram", "temp", "power", "requests")

#: per-GPU plots: plot key → (sample name, scale to display units)
GPU_SERIES = {"vram": (names.MEMORY_USED_BYTES, 1 / GIB), "temp": (names.TEMP_GPU_C, 1.0),
              "power": (names.POWER_W, 1.0)}


def gpu_color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


#: the width of a plot's right axis, px (fixed: see _TwinAxis)
TWIN_AXIS_WIDTH = 52


class _TwinAxis:
    """A second y axis (right) sharing the plot's x axis."""

    def __init__(self, plot: pg.PlotItem, label: str) -> None:
        self.vb = pg.ViewBox()
        plot.showAxis("right")
        plot.scene().addItem(self.vb)
        plot.getAxis("right").linkToView(self.vb)
        plot.getAxis("right").setLabel(label)
        # a fixed width, as the left axes have: an axis that grows with its tick labels
        # ("0.5" → "250") re-lays out the whole grid and re-renders every axis
        plot.getAxis("right").setWidth(TWIN_AXIS_WIDTH)
        self.vb.setXLink(plot)
        self.plot = plot
        plot.vb.sigResized.connect(self._sync)
        self._sync()

    def _sync(self) -> None:
        self.vb.setGeometry(self.plot.vb.sceneBoundingRect())
        self.vb.linkedViewChanged(self.plot.vb, self.vb.XAxis)


#: the throughput plot's right axis, by RampSpec.mode: what the dashed level step line is
LEVEL_AXIS_LABELS = {"concurrency": "concurrency", "rate": "offered req/s"}


class Dashboard(QWidget):
    """``bank_fn()`` returns the current SeriesBank, ``client_fn()`` the ClientSeries,
    ``now_fn()`` session seconds. :meth:`start` / :meth:`stop` the redraw timer."""

    def __init__(self, bank_fn: Callable, client_fn: Callable, now_fn: Callable[[], float],
                 hz: float = 10.0, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bank_fn, self.client_fn, self.now_fn = bank_fn, client_fn, now_fn
        v = QVBoxLayout(self)
        v.setContentsMargins(0, 0, 0, 0)
        self.glw = plot_view(pg.GraphicsLayoutWidget())
        v.addWidget(self.glw)
        self.plots: dict[str, pg.PlotItem] = {}
        spec = [("throughput", "Throughput", "output tok/s"), ("latency", "Latency", "ms"),
                ("vram", "VRAM used per GPU", "GiB"), ("temp", "GPU temperature", "°C"),
                ("power", "GPU power", "W"), ("requests", "Server requests (/metrics)", "requests")]
        first = None
        self._base_titles: dict[str, str] = {}  # what reset() shows again (the VRAM headroom goes)
        for i, (key, title, unit) in enumerate(spec):
            axes = {"bottom": ClockAxis("bottom")}
            if key == "latency":
                axes["left"] = PlainLogAxis("left")
            p = self.glw.addPlot(row=i // 2, col=i % 2, axisItems=axes)
            # short: the longest title sets its column's least width (two columns in a laptop's tab)
            self._base_titles[key] = title + (" (colours: VRAM legend)" if key in ("temp", "power") else "")
            p.setTitle(self._base_titles[key], size="10pt")
            p.setLabel("left", unit)
            if i >= len(spec) - 2:
                p.setLabel("bottom", "session time (m:ss)")
            else:
                # the plots share one time axis (x-linked), drawn once under the bottom
                # row: each scroll of it re-renders every visible time axis
                p.hideAxis("bottom")
            for name in ("left", "bottom"):
                p.getAxis(name).setStyle(maxTickLevel=1)  # major and minor ticks (fewer to lay out)
            # horizontal grid only: the level boundaries mark time, and a vertical grid is
            # drawn by the time axis, so every scroll of the shared time axis re-rendered
            # six plot-sized grid pixmaps (40–80 ms frames at 256 streams)
            p.showGrid(x=False, y=True, alpha=0.2)
            p.setClipToView(True)
            p.setDownsampling(auto=True, mode="peak")
            p.getAxis("left").setWidth(52)
            if first is None:
                first = p
            else:
                p.setXLink(first)
            self.plots[key] = p
        # per-GPU colours are explained once, in the VRAM plot's legend
        self.legends = {k: add_legend(self.plots[k], offset=(-6, -6) if k == "vram" else (6, 4), labelTextSize="8pt", colCount=1 if k in
                                                   ("throughput", "latency", "requests") else 3,
                                                   brush=pg.mkBrush(255, 255, 255, 210))
                        for k in ("throughput", "latency", "vram", "requests")}
        self.legend_fits = {k: LegendFit(self.plots[k], leg, columns=leg.columnCount)
                            for k, leg in self.legends.items()}
        tp = self.plots["throughput"]
        # the 2 s bins swing with the chunks' bursts: shown faint, their trailing mean drawn over them
        self.tps_curve = tp.plot([], [], pen=pg.mkPen((31, 119, 180, 90), width=1),
                                 name=f"{BIN_S:g} s bins")
        self.tps_mean_curve = tp.plot([], [], pen=pg.mkPen("#1f77b4", width=2.5),
                                      name=f"{SMOOTH_S:g} s trailing mean")
        self.level_axis = _TwinAxis(tp, LEVEL_AXIS_LABELS["concurrency"])
        self.level_curve = pg.PlotCurveItem(pen=pg.mkPen("#888", width=1.5,
                                                                                   style=Qt.DashLine))
        self.level_axis.vb.addItem(self.level_curve)
        # the dashed level line is named by its axis ("concurrency", right): no legend row for it
        lp = self.plots["latency"]
        lp.setLogMode(y=True)
        self.lat_curves = {
            "ttft_p50": lp.plot([], [], pen=pg.mkPen("#2ca02c", width=1.5), name="TTFT p50"),
            "ttft_p99": lp.plot([], [], pen=pg.mkPen("#2ca02c", width=2, style=Qt.DashLine), name="TTFT p99"),
            "tpot_p50": lp.plot([], [], pen=pg.mkPen("#9467bd", width=1.5), name="TPOT p50"),
            "tpot_p99": lp.plot([], [], pen=pg.mkPen("#9467bd", width=2, style=Qt.DashLine), name="TPOT p99"),
        }
        vp = self.plots["vram"]
        self.vram_total = vp.plot([], [], pen=pg.mkPen("#444", width=1, style=Qt.DashLine), name="total")
        self.kv_axis = _TwinAxis(vp, "KV cache %")
        self.kv_axis.vb.setYRange(0, 100)
        self.kv_curve = pg.PlotCurveItem([], [], pen=pg.mkPen("#000", width=1.5, style=Qt.DotLine))
        self.kv_axis.vb.addItem(self.kv_curve)
        self.legends["vram"].addItem(self.kv_curve, "KV cache % (right)")
        # the left column's plots line their views up by screen position (pyqtgraph links
        # overlapping views pixel by pixel): a plot there without a second axis gets an empty
        # one of the same width, so every plot of both columns shows one time range
        for i, p in enumerate(self.plots.values()):
            if i % 2 == 0 and not p.getAxis("right").isVisible():
                p.showAxis("right")
                ax = p.getAxis("right")
                ax.setWidth(TWIN_AXIS_WIDTH)
                ax.setStyle(showValues=False)
                ax.setTicks([[], []])
        self.slowdown_line = pg.InfiniteLine(angle=0, pen=pg.mkPen("#d62728", style=Qt.DashLine),
                                             label="slowdown {value:.0f} °C",
                                             labelOpts={"position": 0.1, "color": "#d62728"})
        self.plots["temp"].addItem(self.slowdown_line)
        self.slowdown_line.hide()
        self.power_limit_line = pg.InfiniteLine(angle=0, pen=pg.mkPen("#d62728", style=Qt.DotLine),
                                                label="limit {value:.0f} W",
                                                labelOpts={"position": 0.1, "color": "#d62728"})
        self.plots["power"].addItem(self.power_limit_line)
        self.power_limit_line.hide()
        rp = self.plots["requests"]
        self.req_curves = {names.RUNNING: rp.plot([], [], pen=pg.mkPen("#1f77b4", width=2), name="running"),
                           names.WAITING: rp.plot([], [], pen=pg.mkPen("#ff7f0e", width=2), name="waiting")}
        self.gpu_curves: dict[tuple[str, str], pg.PlotDataItem] = {}
        self.boundaries: list[tuple[float, float]] = []
        self._boundary_items: list[tuple[pg.PlotItem, pg.InfiniteLine]] = []
        self._seen: dict[tuple[str, str], float] = {}
        self._client_version = -1
        # every axis, legend and title is painted from a cached pixmap until it changes:
        # replaying their text on each frame was most of the paint cost
        for p in self.plots.values():
            for name in ("left", "bottom", "right"):
                if p.getAxis(name).isVisible():
                    p.getAxis(name).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
            p.titleLabel.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        for lg in self.legends.values():
            lg.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
        self._turn = 0  # index into TELEMETRY_TURNS
        self._x_follow: tuple[float, float] | None = None  # the x range this dashboard last set
        self._x_until: float | None = None  # a running ramp's planned end (session s)
        self._t_lo: float | None = None  # the earliest time drawn (session s)
        self._y_bounds: dict[str, dict] = {}  # plot → curve → (min, max) of its data
        self._y_set: dict[str, tuple[float, float]] = {}  # plot → the y range this dashboard set
        self._titles: dict[str, str] = {}
        self._lat_n = -1
        self._levels_key = None
        self.frame_costs: list[float] = []
        self._fit_width()
        self.timer = QTimer(self)
        self.timer.setInterval(int(1000 / min(20.0, max(1.0, hz))))
        self.timer.timeout.connect(self.refresh)

    def _fit_width(self) -> None:
        """The plots' grid cannot be narrower than its titles and axes: the tab says so (its
        minimum width), so that the window keeps room for it instead of cutting the right
        column off (issue 37, item 7)."""
        self.glw.setMinimumWidth(math.ceil(self.glw.ci.effectiveSizeHint(Qt.MinimumSize).width()) + 2)

    def showEvent(self, ev) -> None:  # noqa: N802 (Qt's name)
        super().showEvent(ev)
        self._fit_width()  # the axes have their sizes once shown

    # ------------------------------------------------------------------ control
    def start(self) -> None:
        self.timer.start()

    def stop(self) -> None:
        self.timer.stop()

    def fit_legends(self) -> dict[str, bool]:
        """One step of each legend's fit (:class:`widgets.axes.LegendFit`); True per plot
        whose legend is within a quarter of it."""
        return {k: f.step() for k, f in self.legend_fits.items()}

    def set_level_unit(self, mode: str) -> None:
        """Name the dashed level step line's axis for a ramp of ``mode`` (RampSpec.mode):
        users kept in flight, or the offered request rate."""
        self.plots["throughput"].getAxis("right").setLabel(LEVEL_AXIS_LABELS.get(mode, mode))

    def export_plot(self, key: str, path) -> "Path":
        """Save the plot ``key`` (throughput, latency, vram, …) as PNG or SVG
        (:func:`widgets.plot_export.export_plot`; its right-click menu does the same)."""
        return export_plot(self.plots[key], path)

    def reset(self) -> None:
        """Forget everything drawn (a new launch)."""
        for key, c in list(self.gpu_curves.items()):
            self.plots[self._plot_of(key[1])].removeItem(c)
        self.gpu_curves.clear()
        self._seen.clear()
        for p, line in self._boundary_items:
            p.removeItem(line)
        self._boundary_items.clear()
        self.boundaries = []
        self._client_version = -1
        self._t_lo = None
        self._x_follow = None
        self._x_until = None
        self._y_bounds.clear()
        self._y_set.clear()
        for key in ("throughput", "latency", "temp", "power", "requests"):
            self.plots[key].vb.enableAutoRange(axis=pg.ViewBox.YAxis)
        self._lat_n = -1
        self._levels_key = None
        for c in [self.tps_curve, self.tps_mean_curve, self.vram_total, *self.lat_curves.values(), *self.req_curves.values()]:
            c.setData([], [])
        self.level_curve.clear()
        self.kv_curve.setData([], [])
        self.slowdown_line.hide()
        self.power_limit_line.hide()
        for key, title in self._base_titles.items():  # no figure of the last server stays in a title
            self._set_title(key, title)

    @staticmethod
    def _plot_of(name: str) -> str:
        for k, (n, _) in GPU_SERIES.items():
            if n == name:
                return k
        raise KeyError(name)

    # ------------------------------------------------------------------ drawing
    def refresh(self, force: bool = False) -> None:
        """One frame (timer slot): redraw series that changed. Skipped while hidden."""
        if not force and not self.isVisible():
            return
        t0 = time.perf_counter()
        self.fit_legends()  # measured as drawn: one step per frame until each fits
        if force:
            self._draw_telemetry(self.bank_fn(), None)
        else:
            # one telemetry plot per frame, in turn: 8 GPUs × 3 plots of curves set in one
            # frame (and painted in the next) made the longest frames; at 10 Hz each plot
            # still follows its 4 Hz samples within 0.3 s
            self._turn = (self._turn + 1) % len(TELEMETRY_TURNS)
            self._draw_telemetry(self.bank_fn(), TELEMETRY_TURNS[self._turn])
        self._draw_client(self.client_fn())
        self._follow_x(self.now_fn())
        self.frame_costs.append(time.perf_counter() - t0)
        if len(self.frame_costs) > 10000:
            del self.frame_costs[:5000]

    def _seen_t(self, t: np.ndarray) -> None:
        if len(t):
            t0 = float(t[0])
            if t0 == t0 and (self._t_lo is None or t0 < self._t_lo):
                self._t_lo = t0

    def expect_until(self, t: float | None) -> None:
        """A ramp is running until session time ``t`` (s) if no level stops early; None
        when it is over. The time axis then reaches ``t`` at once: every move of the
        shared axis repaints all six plots and re-clips every curve (20–40 ms on the
        2-core machine, measured by benchmarks/gui_stall.py), so during a ramp it
        should not move at all, and the curves fill the planned span from the left."""
        self._x_until = None if t is None else float(t)

    def _follow_x(self, now: float) -> None:
        """Keep the shared time axis on [first sample, now] — or to a running ramp's
        planned end (:meth:`expect_until`) — moving its right end in steps (1-2-5 × 10^k
        s, about a tenth of the span) so that the tick labels — re-rendered text — change
        a few times a minute, not on every frame. A user who zooms or pans keeps that
        view; the plot's auto-range button ("A") gives the axis back."""
        if self._t_lo is None:
            return
        vb = self.plots["throughput"].vb
        (x0, x1), auto_x = vb.viewRange()[0], vb.state["autoRange"][0]
        if not auto_x and self._x_follow is not None and (
                abs(x0 - self._x_follow[0]) > 1e-6 or abs(x1 - self._x_follow[1]) > 1e-6):
            return  # the user's own view
        right = max(now, self._x_until or now)
        span = max(right - self._t_lo, 10.0)
        step = nice_step(span / 10.0)
        want = (self._t_lo, math.ceil(max(right, self._t_lo + 1e-9) / step) * step)
        if auto_x or want != self._x_follow:
            vb.disableAutoRange(axis=vb.XAxis)
            vb.setXRange(*want, padding=0)
            self._x_follow = want

    def _note_y(self, plot_key: str, curve_key, values: np.ndarray) -> None:
        """Remember the finite min/max of one curve of a plot whose y range we keep."""
        fin = values[np.isfinite(values)]
        if fin.size:
            self._y_bounds.setdefault(plot_key, {})[curve_key] = (float(fin.min()), float(fin.max()))

    def _fit_y(self, plot_key: str, floor_zero: bool = False, from_zero: bool = False, log: bool = False) -> None:
        """Y range of a plot on 1-2-5 steps around its data, changed only when the data
        leave it: pyqtgraph's auto-range follows every new extreme (4 Hz), and each change
        re-renders the axis text and grid. ``floor_zero``: never below 0; ``from_zero``:
        always from 0 (rates); ``log``: a log-scale plot (latency), whose range — in log10
        units, as pyqtgraph's log mode takes it — spans whole half-decades (e.g. 10^1.5 …
        10^3.5 ms). A user's own y view is kept."""
        b = self._y_bounds.get(plot_key)
        if not b:
            return
        lo, hi = min(v[0] for v in b.values()), max(v[1] for v in b.values())
        margin = 0.0
        if log:
            if not (lo > 0 and hi > 0):
                return
            lo, hi, margin = math.log10(lo), math.log10(hi), 0.02
        if from_zero:  # a rate: the axis starts at 0 so that jitter is not magnified
            lo = min(lo, 0.0)
        vb = self.plots[plot_key].vb
        (y0, y1), auto_y = vb.viewRange()[1], vb.state["autoRange"][1]
        last = self._y_set.get(plot_key)
        if not auto_y and last is not None and (abs(y0 - last[0]) > 1e-9 or abs(y1 - last[1]) > 1e-9):
            return  # the user's own view
        if last is not None and last[0] <= lo - margin and hi + margin <= last[1] and (hi - lo) > 0.2 * (last[1] - last[0]):
            if auto_y:
                vb.disableAutoRange(axis=vb.YAxis)
                vb.setYRange(*last, padding=0)
            return  # still fits, and not so loosely that the curves flatten
        if log:
            want = (math.floor((lo - margin) * 2) / 2, math.ceil((hi + margin) * 2) / 2)
        else:
            span = max(hi - lo, abs(hi) * 0.05, 1.0)
            step = nice_step(span / 4.0)
            want = (math.floor(lo / step) * step - (step if lo % step == 0 and lo > 0 else 0),
                    math.ceil(hi / step) * step + (step if hi % step == 0 else 0))
        if floor_zero:
            want = (max(0.0, want[0]), want[1])
        vb.disableAutoRange(axis=vb.YAxis)
        vb.setYRange(*want, padding=0)
        self._y_set[plot_key] = want

    def _set_title(self, key: str, text: str) -> None:
        """Set a plot title only when its text changes (a title change relays out the plot)."""
        if self._titles.get(key) != text:
            self._titles[key] = text
            self.plots[key].setTitle(text, size="10pt")

    def _changed(self, bank, src: str, name: str) -> bool:
        last = bank.last(src, name)
        if last is None:
            return False
        if self._seen.get((src, name)) == last[0]:
            return False
        self._seen[(src, name)] = last[0]
        return True

    def _draw_telemetry(self, bank, only: str | None = None) -> None:
        """Set the telemetry curves that changed; ``only``: just this plot's (a key of
        :data:`TELEMETRY_TURNS`), None for all."""
        if bank is None:
            return
        gpus = sorted({s for s, _ in bank.keys() if s.startswith("gpu") and s[3:].isdigit()}, key=lambda s: int(s[3:]))
        for src in gpus:
            i = int(src[3:])
            for plot_key, (name, scale) in GPU_SERIES.items():
                if only is not None and plot_key != only:
                    continue
                if not self._changed(bank, src, name):
                    continue
                key = (src, name)
                c = self.gpu_curves.get(key)
                if c is None:
                    c = self.plots[plot_key].plot([], [], pen=pg.mkPen(gpu_color(i), width=1.5),
                                                  name=f"GPU {i}" if plot_key == "vram" else None)
                    c.setClipToView(True)
                    self.gpu_curves[key] = c
                t, val = bank.get(src, name)
                self._seen_t(t)
                c.setData(t, val * scale, connect="finite")
                if plot_key != "vram":
                    self._note_y(plot_key, key, val * scale)
        if gpus and only in (None, "vram"):
            g0 = gpus[0]
            if self._changed(bank, g0, names.MEMORY_TOTAL_BYTES):
                t, val = bank.get(g0, names.MEMORY_TOTAL_BYTES)
                self.vram_total.setData(t, val / GIB, connect="finite")
                fin = val[np.isfinite(val)]
                if fin.size:
                    self.plots["vram"].setYRange(0, float(fin.max()) / GIB * 1.08, padding=0)
            heads = [bank.last(g, names.VRAM_HEADROOM_BYTES) for g in gpus]
            heads = [h[1] for h in heads if h is not None and h[1] == h[1]]
            if heads:
                # short: the title sets its column's least width (issue 37, item 7)
                self._set_title("vram", f"VRAM per GPU, headroom {min(heads) / GIB:.2f} GiB")
        if gpus and only in (None, "temp", "power"):
            g0 = gpus[0]
            last = bank.last(g0, names.TEMP_SLOWDOWN_C)
            if last is not None and last[1] == last[1]:
                if self.slowdown_line.value() != last[1] or not self.slowdown_line.isVisible():
                    place_line(self.slowdown_line, last[1], f"slowdown {last[1]:.0f} °C")
            last = bank.last(g0, names.POWER_LIMIT_W)
            if last is not None and last[1] == last[1]:
                if self.power_limit_line.value() != last[1] or not self.power_limit_line.isVisible():
                    place_line(self.power_limit_line, last[1], f"limit {last[1]:.0f} W")
        if only not in (None, "requests"):
            if only != "vram":  # VRAM keeps 0 … total
                self._fit_y(only, floor_zero=only == "power")
            return
        for name, c in self.req_curves.items():
            if self._changed(bank, "metrics", name):
                t, val = bank.get("metrics", name)
                self._seen_t(t)
                c.setData(t, val, connect="finite")
                self._note_y("requests", name, val)
        if self._changed(bank, "metrics", names.KV_CACHE_USAGE):
            t, val = bank.get("metrics", names.KV_CACHE_USAGE)
            ok = np.isfinite(val)
            self.kv_curve.setData(t[ok], val[ok] * 100.0)

        if only is None:
            self._fit_y("temp")
            self._fit_y("power", floor_zero=True)
        self._fit_y("requests", floor_zero=True)

    def _draw_client(self, client) -> None:
        if client is None:
            return
        now = self.now_fn()
        snap = client.snapshot(now)
        if len(snap.tps_t) != len(self.tps_curve.xData if self.tps_curve.xData is not None else []):
            self._seen_t(snap.tps_t)
            self.tps_curve.setData(snap.tps_t, snap.tps)
            self.tps_mean_curve.setData(snap.tps_t, snap.tps_mean)
            self._note_y("throughput", "tps", snap.tps)
            self._fit_y("throughput", floor_zero=True, from_zero=True)
        if snap.levels.size:
            self._seen_t(snap.level_edges)
            # the open level's step runs to "now": redrawn about once a second, not per frame
            key = (snap.level_edges.size, round(float(snap.level_edges[-1])), float(snap.levels.max()))
            if key != self._levels_key:
                self._levels_key = key
                self.level_curve.setData(snap.level_edges, snap.levels, stepMode="center")
                self.level_axis.vb.setYRange(0, float(snap.levels.max()) * 1.1)
        elif self.level_curve.xData is not None and len(self.level_curve.xData):
            self.level_curve.clear()
            self._levels_key = None
        if snap.lat_t.size == self._lat_n:
            pass  # no window closed since the last frame
        elif snap.lat_t.size:
            self._lat_n = snap.lat_t.size
            ms = 1000.0
            for key, arr in (("ttft_p50", snap.ttft_p50), ("ttft_p99", snap.ttft_p99),
                             ("tpot_p50", snap.tpot_p50), ("tpot_p99", snap.tpot_p99)):
                ok = np.isfinite(arr) & (arr > 0)
                self.lat_curves[key].setData(snap.lat_t[ok], arr[ok] * ms)
                self._note_y("latency", key, arr[ok] * ms)
            self._fit_y("latency", log=True)
        else:
            self._lat_n = 0
            for c in self.lat_curves.values():
                c.setData([], [])
        if snap.boundaries != self.boundaries:
            self._set_boundaries(snap.boundaries)

    def _set_boundaries(self, bounds: list[tuple[float, float]]) -> None:
        """Level-start lines on every plot; a new level only adds its own lines."""
        n = len(self.boundaries)
        if bounds[:n] == self.boundaries:
            new = bounds[n:]
        else:
            for p, line in self._boundary_items:
                p.removeItem(line)
            self._boundary_items = []
            new = bounds
        for t, level in new:
            for key, p in self.plots.items():
                line = pg.InfiniteLine(pos=t, angle=90, pen=pg.mkPen("#999", width=1, style=Qt.DotLine),
                                       label=f"{level:g}" if key == "throughput" else None,
                                       labelOpts={"position": 0.7, "color": "#666"})
                p.addItem(line, ignoreBounds=True)
                self._boundary_items.append((p, line))
        self.boundaries = list(bounds)

    def plots_with_data(self) -> dict[str, bool]:
        """Plot key → whether any of its curves holds data (for tests and the UI)."""
        out = {}
        for key, p in self.plots.items():
            items = [c for c in p.listDataItems()]
            if key == "throughput":
                items.append(self.level_curve)
            if key == "vram":
                items.append(self.kv_curve)
            out[key] = any(c.xData is not None and len(c.xData) > 0 for c in items
                           if hasattr(c, "xData"))
        return out
