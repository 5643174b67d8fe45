"""Run by tests/test_gui_xcb.py in a process of its own on an Xvfb display with Qt's xcb
platform: open the main window as a user's first start does (no saved geometry), wait
until it is shown, grab the whole screen to ``argv[1]`` (PNG) and print, as JSON, where
the window, its status bar and the first-run strip are against the screen."""
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
    print(json.dumps(out), flush=True)
    win.shutdown()
    win.close()
    app.processEvents()
    return 0


if __name__ == "__main__":
    sys.exit(main())
