"""What the run controller tells its subscribers: its :class:`State` and the
:class:`RunListener` callbacks. Imports nothing heavy, so that a front end (the CLI's
commands) can subclass the listener without loading the whole core at start-up.
"""
from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only
    from app.loadgen.spec import RampSpec
    from app.loadgen.stats import StepStats
    from app.planner.diagnose import Diagnosis
    from app.run.controller import RampOutcome
    from app.planner.launch_defaults import LaunchDefaults


class State(str, enum.Enum):
    """The controller's state: the supervisor's, plus ``idle`` and ``attached``."""

    IDLE = "idle"
    STARTING = "starting"
    LOADING = "loading"
    READY = "ready"
    ATTACHED = "attached"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"


class RunListener:
    """Subscriber of a :class:`RunController`; override what you need. Called on the
    controller's worker threads."""

    def on_state(self, state: State, reason: str) -> None:
        """The controller's state changed (``reason``: the failure, or the URL at ready)."""

    def on_line(self, stream: str, text: str, t: float) -> None:
        """A server log line (session-clock seconds)."""

    def on_launch_defaults(self, defaults: LaunchDefaults) -> None:
        """The CPU build's working defaults filled in before the launch, for what the
        user did not set (``defaults.chosen``, ``defaults.notes``; what to print:
        ``defaults.lines()``); for a rig, once per host whose agent filled some in
        (``defaults.host`` names it)."""

    def on_rig_part(self, part: dict) -> None:
        """A host's part of a rig's server was started by its agent (head first):
        ``host`` (its SSH destination), ``role`` (``head``/``headless``), ``rank``, ``pid``,
        ``pgid``, ``url`` (the head's API server; a headless part's means nothing),
        ``argv``, ``defaults`` (the CPU build's defaults its agent filled in, or None)."""

    def on_launch_phase(self, progress: Any) -> None:
        """The launch entered a new phase (from the server's log):
        :class:`app.run.launch_timing.LaunchProgress` — phase, elapsed s, expected s left."""

    def on_launch_failed(self, reason: str, diagnosis: Diagnosis | None) -> None:
        """The server failed (to start, or after it was ready), with the diagnosis."""

    def on_ramp_started(self, spec: RampSpec) -> None:
        """A ramp began (``spec`` in rig seconds)."""

    def on_level_start(self, ev: dict) -> None:
        """A level began: ``{"idx", "level", "t"}`` (t wall seconds)."""

    def on_records(self, records: list) -> None:
        """Completed requests (:class:`app.loadgen.records.RequestRecord`)."""

    def on_level(self, st: StepStats) -> None:
        """A level ended; its stats in rig seconds."""

    def on_safety_stop(self, reason: str) -> None:
        """A safety limit stopped the ramp."""

    def on_ramp_done(self, outcome: RampOutcome) -> None:
        """The ramp ended and is recorded (``outcome.run_id``)."""

    def on_record_failed(self, message: str) -> None:
        """The run could not be (completely) recorded: ``message`` names the store's path
        and the cause, and what happens next."""

    def on_run_saved(self, run_id: int) -> None:
        """A run the store refused at first (a full disk) is now saved completely."""
