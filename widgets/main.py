"""GUI entry point: ``vllm-dyno`` with no subcommand (app/cli/__init__.py) calls :func:`main`.

With ``VLLM_DYNO_SMOKE=/path/shot.png`` in the environment it runs the smoke sequence
of :mod:`widgets.smoke` instead (demo sim → 3-level ramp → screenshot → stop → exit).
"""
from __future__ import annotations

import os
import sys
import time
from importlib import resources

import pyqtgraph as pg
from PySide6.QtWidgets import QApplication

from widgets.main_window import MainWindow
from widgets.platform_check import PlatformProblem, check_platform


def create_app(argv: list[str] | None = None):
    """The QApplication (created once), with the app's style sheet and pyqtgraph options.

    The style sheet is package data (``resources/style.qss``) read through
    :mod:`importlib.resources`, so it is found in a checkout, an installed wheel and a
    frozen build alike."""

    # The GUI thread re-takes the GIL for every Python callback Qt makes (each item's
    # paint, each slot); with the default 5 ms switch interval a busy helper thread (load
    # generator reader, /metrics parser, store writer) can make it wait 5 ms each time.
    sys.setswitchinterval(0.001)
    app = QApplication.instance() or QApplication(list(argv if argv is not None else sys.argv[:1]))
    app.setApplicationName("vLLM Dyno")
    app.setOrganizationName("vllm-dyno")

    pg.setConfigOptions(background="w", foreground="#333", antialias=False)
    qss = resources.files("resources").joinpath("style.qss")
    if qss.is_file():
        app.setStyleSheet(qss.read_text(encoding="utf-8"))
    return app


def main(argv: list[str] | None = None) -> int:
    """Open the main window and run the event loop; returns the exit code (1 with the
    missing packages named when Qt's platform cannot open a window here:
    :mod:`widgets.platform_check`)."""
    try:
        check_platform()
    except PlatformProblem as e:
        print(e, file=sys.stderr)
        return 1
    shot = os.environ.get("VLLM_DYNO_SMOKE")
    if shot:
        from widgets.smoke import run_smoke  # deferred: widgets.smoke imports this module (create_app)

        return run_smoke(shot, argv)
    t0 = time.perf_counter()
    app = create_app(argv)

    win = MainWindow()
    win.show()
    # the window's own start, not a server's (none runs yet)
    win.statusBar().showMessage(f"Window ready in {time.perf_counter() - t0:.2f} s — no server is running: "
                                "Launch starts one", 6000)
    return int(app.exec())


if __name__ == "__main__":
    sys.exit(main())
