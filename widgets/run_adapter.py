"""The GUI's adapter on the run controller (:class:`app.run.controller.RunController`).

Presentation only: the core sequences the run (launch, telemetry, sim time scale,
safety stops, recording, diagnosis, J/token); this adapter turns its callbacks — which
arrive on the core's worker threads — into Qt signals delivered on the GUI thread, and
runs the core's blocking calls (launch checks, interpreter probe, stop) on background
threads (:mod:`widgets.tasks`). Log lines are buffered and pulled by the log pane's
timer (never one signal per line).
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

from PySide6.QtCore import QObject, Signal

from app.run.controller import LaunchTarget, RampOutcome, RecordSpec, RunController, RunListener, State
from app.server.procs import end_leftovers
from widgets.tasks import on_gui_thread, run_in_background

log = logging.getLogger(__name__)

#: the states the window shows (the core's)
IDLE, ATTACHED = State.IDLE.value, State.ATTACHED.value



class _ToQt(RunListener):
    """Core callbacks (worker threads) → the adapter's signals (GUI thread)."""

    def __init__(self, owner: "RunAdapter") -> None:
        self.owner = owner

    def on_state(self, state: State, reason: str) -> None:
        on_gui_thread(lambda: self.owner._on_state(state.value, reason))

    def on_line(self, stream: str, text: str, t: float) -> None:
        self.owner._push_line(stream, text, t)

    def on_launch_defaults(self, defaults) -> None:
        # shown in the Log pane, before the server's own lines
        for line in defaults.lines():
            self.owner._push_line("vllm-dyno", line, self.owner.clock.now())

    def on_launch_failed(self, reason: str, diagnosis) -> None:
        on_gui_thread(lambda: self.owner.launch_failed.emit(reason, diagnosis))

    def on_ramp_started(self, spec) -> None:
        on_gui_thread(lambda: self.owner._on_core_ramp_started(spec))

    def on_level_start(self, ev: dict) -> None:
        on_gui_thread(lambda: self.owner.level_started.emit(ev))

    def on_records(self, records) -> None:
        on_gui_thread(lambda: self.owner.records_added.emit(records))

    def on_level(self, st) -> None:
        on_gui_thread(lambda: self.owner.level_done.emit(st))

    def on_safety_stop(self, reason: str) -> None:
        on_gui_thread(lambda: self.owner.safety_stop.emit(reason))

    def on_ramp_done(self, outcome: RampOutcome) -> None:
        on_gui_thread(lambda: self.owner._on_ramp_done(outcome))

    def on_record_failed(self, message: str) -> None:
        on_gui_thread(lambda: self.owner.record_failed.emit(message))

    def on_run_saved(self, run_id: int) -> None:
        on_gui_thread(lambda: self.owner.run_recorded.emit(run_id))


class RunAdapter(QObject):
    """Signals (all delivered on the GUI thread):

    ``state_changed(state, reason)``; ``launch_failed(reason, Diagnosis|None)``;
    ``leftovers_found(list[LeftoverProcess], LaunchTarget)`` (launch paused);
    ``stopped(list[int])`` leftover pids after a stop; ``ramp_started(RampSpec)`` (a ramp
    of :meth:`run_ramp`, or one the core started for the tuner);
    ``level_started(dict)``; ``level_done(StepStats)`` (rig seconds);
    ``ramp_finished(RampOutcome)`` (``run_id`` set when recorded); ``run_recorded(int)``
    once its run is complete in the run store; ``record_failed(str)``; ``safety_stop(str)``.

    ``store_fn``: returns the run store (called off the GUI thread on the first record).
    """

    state_changed = Signal(str, str)
    launch_failed = Signal(str, object)
    leftovers_found = Signal(object, object)
    stopped = Signal(object)
    ramp_started = Signal(object)
    level_started = Signal(dict)
    level_done = Signal(object)
    #: finished requests (a list of RequestRecord, wall seconds): the ramp's progress counts them
    records_added = Signal(object)
    ramp_finished = Signal(object)
    safety_stop = Signal(str)
    run_recorded = Signal(int)
    record_failed = Signal(str)

    def __init__(self, parent: QObject | None = None, store_fn: Any = None) -> None:
        super().__init__(parent)
        self.core = RunController(store=store_fn, listener=_ToQt(self))
        self.state = IDLE
        self._lines: collections.deque[tuple[float, str, str]] = collections.deque(maxlen=50000)
        self._lines_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._ramp_open = False

    # ------------------------------------------------------------------ the core's state
    @property
    def clock(self):
        return self.core.clock

    @property
    def bank(self):
        return self.core.bank

    @property
    def client(self):
        return self.core.client

    @property
    def supervisor(self):
        return self.core.supervisor

    @property
    def url(self) -> str | None:
        return self.core.url

    @property
    def api_model(self) -> str | None:
        return self.core.api_model

    @property
    def time_scale(self) -> float:
        return self.core.time_scale

    @property
    def ramp_spec(self):
        return self.core.ramp_spec

    @property
    def server_running(self) -> bool:
        return self.state in ("starting", "loading", "ready", "stopping", ATTACHED)

    @property
    def ready(self) -> bool:
        return self.state in ("ready", ATTACHED)

    @property
    def ramp_running(self) -> bool:
        """True from Run ramp until ``ramp_finished`` was delivered on the GUI thread."""
        return self._ramp_open

    def launch_progress(self):
        """The launch's phase, elapsed and expected seconds left (the core's; cheap: it
        reads what the log said), or None without a launched server."""
        return self.core.launch_progress()

    def rig_status(self) -> list[dict]:
        """The launched rig's hosts (the core's :meth:`RunController.rig_status`; plain
        dicts, safe from the GUI thread); ``[]`` for a one-host launch."""
        return self.core.rig_status()

    def energy(self, st):
        """Power and J/token of a level (the core's one definition)."""
        return self.core.energy(st)

    # ------------------------------------------------------------------ helpers
    def _bg(self, name: str, fn, on_done=None, on_error=None) -> threading.Thread:
        t = run_in_background(name, fn, on_done, on_error)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        return t

    def _on_state(self, state: str, reason: str) -> None:
        self.state = state
        self.state_changed.emit(state, reason)

    def take_lines(self) -> list[tuple[float, str, str]]:
        """Log lines ``(t, stream, text)`` received since the last call (GUI timer pulls)."""
        with self._lines_lock:
            out = list(self._lines)
            self._lines.clear()
        return out

    def _push_line(self, stream: str, text: str, t: float) -> None:
        with self._lines_lock:
            self._lines.append((t, stream, text.rstrip("\n")))

    # ------------------------------------------------------------------ launch
    def launch(self, req: LaunchTarget, skip_leftover_check: bool = False) -> None:
        """Start the server (or attach). Returns at once; progress comes as signals."""
        if self.server_running:
            raise RuntimeError("a server is already running in this session; stop it first")
        self.state = "starting"

        def done(left) -> None:
            if left:
                self.leftovers_found.emit(left, req)

        def failed(e: BaseException) -> None:
            # the core already reported a LaunchError (state failed, launch_failed); anything else here
            if self.core.state != State.FAILED:
                self._on_state("failed", str(e))
                self.launch_failed.emit(str(e), None)

        self._bg("launch", lambda: self.core.launch(req, check_leftovers=not skip_leftover_check), done, failed)

    def end_leftovers_and_launch(self, left: list, req: LaunchTarget) -> None:
        """End the given leftover processes (``LeftoverProcess``; only orphaned ones are
        ended, see app.server.procs.end_leftovers) in the background, then launch ``req``."""

        self._bg("end-leftovers", lambda: end_leftovers(left), lambda _left: self.launch(req, True),
                 lambda e: self.launch_failed.emit(f"could not end leftover processes: {e}", None))

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Abort any ramp and stop telemetry and the server (background); ``stopped`` follows."""
        if self.state in (IDLE, "stopped", "failed") and self.core.supervisor is None and self.core.telemetry is None:
            return
        self._bg("stop", self.core.stop, self.stopped.emit, lambda e: self.stopped.emit([]))

    def shutdown(self, timeout: float = 30.0) -> list[int]:
        """Blocking stop of everything (window close, tests); a ramp in progress is
        recorded as aborted. Returns leftover pids."""
        left = self.core.stop(reason="the window was closed during the ramp", timeout=timeout)
        deadline = time.monotonic() + timeout
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))
        return left

    # ------------------------------------------------------------------ ramp
    def run_ramp(self, spec, safety=None, record: RecordSpec | None = None) -> None:
        """Start a ramp (a :class:`app.loadgen.spec.RampSpec` in rig seconds whose url is
        this server's). ``safety``: the window's SafetyLimits (None: the user's Settings, as
        the controller reads them for every ramp); ``record``: record it as a run."""
        self.core.start_ramp(spec, record=record, safety=safety)
        self._ramp_open = True
        self.ramp_started.emit(self.core.ramp_spec)

    def _on_core_ramp_started(self, spec) -> None:
        """A ramp the core started for someone else (the tuner's searches): announced as
        ``ramp_started`` too (:meth:`run_ramp` announces its own)."""
        if not self._ramp_open:
            self.ramp_started.emit(spec)

    def _on_ramp_done(self, out: RampOutcome) -> None:
        self._ramp_open = False
        self.ramp_finished.emit(out)
        if out.run_id is not None:
            self.run_recorded.emit(out.run_id)

    def abort_ramp(self, reason: str | None = None) -> None:
        """Ask the running ramp to stop (completed levels are kept)."""
        self.core.abort_ramp(reason)
