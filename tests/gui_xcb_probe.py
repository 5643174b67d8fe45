"""Run by tests/integration/test_gui_xcb.py in a process of its own on an Xvfb display with Qt's xcb
platform: open the main window as a user's first start does (no saved geometry), wait
until it is shown, grab the whole screen to ``argv[1]`` (PNG) and print, as JSON, where
the window, its status bar and the first-run strip are against the screen, the screen's
device pixel ratio, and — for every plot of the Live and Curves tabs (each shown in
turn) — how much of its plot area its legend covers."""
from __future__ import annotations

import json
import sys
import time

from PySide6.QtCore import QPoint
from PySide6.QtWidgets import QApplication

from widgets.main import create_app
from widgets.main_window import MainWindow


def main() -> int:
    app = create_app([sys.argv[0]])
    win = MainWindow(restore=False)
    win.show()
    end = time.monotonic() + 20
    while time.monotonic() < end and not (win.isVisible() and win.windowHandle() and win.windowHandle().isExposed()):
        app.processEvents()
        time.sleep(0.02)
    for _ in range(50):  # the layout settles
        app.processEvents()
        time.sleep(0.01)
    scr = win.screen()
    avail = scr.availableGeometry()
    sb = win.statusBar()
    tl = sb.mapToGlobal(QPoint(0, 0))
    out = {"platform": QApplication.platformName(), "screen": [avail.x(), avail.y(), avail.width(), avail.height()],
           "frame": [win.frameGeometry().x(), win.frameGeometry().y(), win.frameGeometry().width(),
                     win.frameGeometry().height()],
           "status_bar": [tl.x(), tl.y(), sb.width(), sb.height()], "status_text": sb.currentMessage(),
           "first_run_visible": win.first_run.isVisible(),
           "first_run_text": [lab.text() for lab in win.first_run.labels.values()],
           "minimum": [win.minimumSizeHint().width(), win.minimumSizeHint().height()]}
    ok = scr.grabWindow(0).save(sys.argv[1], "PNG")
    out["grabbed"] = bool(ok)
    out["dpr"] = scr.devicePixelRatio()
    out["legends"] = {}
    for tab, plots in ((win.dashboard, win.dashboard.plots),
                       (win.curves, {"throughput": win.curves.tput_plot, "latency": win.curves.lat_plot})):
        win.tabs.setCurrentWidget(tab)
        end = time.monotonic() + 2.0  # a few redraw ticks: the legends fit themselves step by step
        while time.monotonic() < end:
            app.processEvents()
            time.sleep(0.01)
        for key, plot in plots.items():
            leg = plot.legend
            if leg is None or not leg.isVisible() or not leg.items:
                continue
            area = plot.vb.sceneBoundingRect()
            r = leg.sceneBoundingRect().intersected(area)
            out["legends"][f"{type(tab).__name__}.{key}"] = round(r.width() * r.height() / max(1.0, area.width()
                                                                                                 * area.height()), 3)
    if len(sys.argv) > 2:  # the Live tab, for a look
        win.tabs.setCurrentWidget(win.dashboard)
        for _ in range(30):
            app.processEvents()
            time.sleep(0.01)
        scr.grabWindow(0).save(sys.argv[2], "PNG")
    print(json.dumps(out), flush=True)
    win.shutdown()
    win.close()
    app.processEvents()
    return 0


if __name__ == "__main__":
    sys.exit(main())
