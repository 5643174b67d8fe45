"""Qt fixtures for the GUI tests (a pytest plugin registered by ``tests/conftest.py``;
not part of the shipped package). Qt is imported inside the fixtures, so a run of the
unit tier never loads it.

``gui_guard`` fails a test that leaves a QThread running, a QTimer active, a top-level
widget open, or a thread it started (GUI workers ``dyno-gui-*``, supervisor readers,
samplers, the load generator's readers) alive. ``main_window`` gives a MainWindow on
the demo profile and shuts it down (server, ramp, telemetry, timers) at the end.
"""
from __future__ import annotations

import threading
import time

import pytest


def pump(qtbot, cond, timeout: float, what: str) -> None:
    """Process events until ``cond()`` is true; fail naming ``what`` after ``timeout`` s."""
    qtbot.waitUntil(cond, timeout=int(timeout * 1000))
    assert cond(), what


def qt_leaks(before: set[threading.Thread]) -> list[str]:
    """What is still running: visible top-level widgets, active QTimers, running QThreads,
    and Python threads not in ``before`` that stay alive for 10 s."""
    from PySide6.QtCore import QThread, QTimer
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    out = []
    for w in app.topLevelWidgets():
        if w.isVisible():
            out.append(f"top-level widget still open: {type(w).__name__} {w.windowTitle()!r}")
        for t in w.findChildren(QTimer):
            if t.isActive():
                out.append(f"QTimer still active in {type(w).__name__} (parent {type(t.parent()).__name__})")
        for th in w.findChildren(QThread):
            if th.isRunning():
                out.append(f"QThread still running in {type(w).__name__}")
    for t in app.findChildren(QTimer):
        if t.isActive():
            out.append("QTimer still active on the application")
    for t in app.findChildren(QThread):
        if t.isRunning():
            out.append("QThread still running on the application")
    deadline = time.monotonic() + 10.0
    alive = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        app.processEvents()
        alive = [t for t in alive if t.is_alive()]
    out += [f"thread still running: {t.name}" for t in alive]
    return out


@pytest.fixture
def gui_guard(qapp):
    """Fail the test when it leaves Qt threads/timers/windows or Python threads behind."""
    from PySide6.QtCore import QEvent
    from PySide6.QtWidgets import QApplication

    from widgets.main import create_app

    create_app()
    before = set(threading.enumerate())
    yield
    QApplication.processEvents()
    leaks = qt_leaks(before)
    for w in QApplication.instance().topLevelWidgets():  # do not let one test's leak break the next
        w.close()
        w.deleteLater()
    # … and delete them now: a deleteLater posted outside an event loop waits for the next
    # loop a test runs (qtbot.wait), so windows of several tests were deleted together, tests
    # later, after the garbage collector had freed parts of them (Qt crashed in that cascade)
    QApplication.sendPostedEvents(None, QEvent.DeferredDelete)
    QApplication.processEvents()
    if leaks:
        pytest.fail("the test left things running:\n  " + "\n  ".join(leaks))


@pytest.fixture
def main_window(gui_guard, qtbot):
    """A MainWindow (demo profile, no restored geometry), closed and shut down after."""
    from PySide6.QtWidgets import QApplication

    from widgets.main_window import MainWindow

    w = MainWindow(restore=False)
    w.show()
    yield w
    left = w.shutdown()
    w.close()
    w.deleteLater()
    QApplication.processEvents()
    assert left == [], f"processes of the server's group survived: {left}"
