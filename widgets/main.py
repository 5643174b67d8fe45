"""GUI entry point: ``vllm-dyno`` with no subcommand (app/cli.py) calls :func:`main`."""
from __future__ import annotations

import sys
import time
from pathlib import Path

RESOURCES = Path(__file__).resolve().parent.parent / "resources"


def create_app(argv: list[str] | None = None):
    """The QApplication (created once), with the app's style sheet and pyqtgraph options."""
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication(list(argv if argv is not None else sys.argv[:1]))
    app.setApplicationName("vLLM Dyno")
    app.setOrganizationName("vllm-dyno")
    import pyqtgraph as pg

    pg.setConfigOptions(background="w", foreground="#333", antialias=False)
    qss = RESOURCES / "style.qss"
    if qss.is_file():
        app.setStyleSheet(qss.read_text(encoding="utf-8"))
    return app


def main(argv: list[str] | None = None) -> int:
    """Open the main window and run the event loop; returns the exit code."""
    t0 = time.perf_counter()
    app = create_app(argv)
    from widgets.main_window import MainWindow

    win = MainWindow()
    win.show()
    win.statusBar().showMessage(f"Ready in {time.perf_counter() - t0:.2f} s", 4000)
    return int(app.exec())


if __name__ == "__main__":
    sys.exit(main())
