"""Run a blocking core call off the GUI thread and get its result back on the GUI thread.

The GUI thread never waits on the supervisor, the load generator, NVML or HTTP
(issue 7, "Responsiveness"): such calls go through :func:`run_in_background`, which
runs ``fn`` on a daemon thread named ``dyno-gui-<name>`` and delivers the result (or
the exception) through a queued Qt signal to callbacks that run on the GUI thread.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

import shiboken6
from PySide6.QtCore import QObject, Qt, Signal

log = logging.getLogger(__name__)


class _Relay(QObject):
    """Lives on the GUI thread; its signal carries a callable to run there."""

    call = Signal(object)

    def __init__(self) -> None:
        super().__init__()
        self.call.connect(self._run, Qt.QueuedConnection)

    @staticmethod
    def _run(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:  # a GUI callback must not kill the event loop
            log.exception("GUI callback failed")


_relay: _Relay | None = None


def relay() -> _Relay:
    """The process-wide relay (created on first use, on the GUI thread)."""
    global _relay
    if _relay is None:
        _relay = _Relay()
    return _relay


def on_gui_thread(fn: Callable[[], None]) -> None:
    """Queue ``fn()`` to run on the GUI thread (callable from any thread). Once the
    application is gone (a worker finishing after the window closed and Qt deleted the
    relay) there is no GUI to run it on: it is dropped."""
    try:
        relay().call.emit(fn)
    except RuntimeError as e:  # "Signal source has been deleted": the app is quitting
        log.debug("GUI gone, a background result dropped: %s", e)


def _receiver_alive(cb: Callable) -> bool:
    """False when ``cb`` is a bound method of a Qt object whose C++ side is deleted (a
    window closed and deleted while its worker ran): calling it would touch freed memory."""
    owner = getattr(cb, "__self__", None)
    return not isinstance(owner, QObject) or shiboken6.isValid(owner)


def _deliver(cb: Callable, arg: Any) -> None:
    if _receiver_alive(cb):
        cb(arg)
    else:
        log.debug("receiver of a background result is gone: dropped")


def run_in_background(name: str, fn: Callable[[], Any], on_done: Callable[[Any], None] | None = None,
                      on_error: Callable[[BaseException], None] | None = None) -> threading.Thread:
    """Run ``fn()`` on a daemon thread; ``on_done(result)`` or ``on_error(exc)`` then run on
    the GUI thread. Returns the thread (tests join it)."""
    relay()  # make sure it exists on the GUI thread before the worker needs it

    def work() -> None:
        try:
            res = fn()
        except BaseException as e:  # delivered to the GUI, never raised on the worker
            if on_error is not None:
                on_gui_thread(lambda e=e: _deliver(on_error, e))
            else:
                log.error("background task %s failed: %s", name, e, exc_info=e)
            return
        if on_done is not None:
            on_gui_thread(lambda: _deliver(on_done, res))

    t = threading.Thread(target=work, name=f"dyno-gui-{name}", daemon=True)
    t.start()
    return t
