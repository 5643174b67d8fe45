"""A running ramp's state (:class:`RampRun`), its safety check and how its end is read.

The run controller (:mod:`app.run.controller`) starts one ramp at a time and holds its
:class:`RampRun`: the spec (rig seconds), how it is recorded, its load generator, the
levels so far (rig seconds), why it stopped, and the outcome once done. Written by the
ramp thread and read by any (``lock`` guards ``steps`` and the reasons).
"""
from __future__ import annotations

import threading

from app.loadgen.generator import LoadGenerator, RampResult
from app.loadgen.spec import RampSpec
from app.loadgen.stats import StepStats
from app.run.outcome import OK_STATUSES, RampOutcome
from app.run.record import RecordSpec, RunRecorder
from app.run.safety import thermal_stop_reason
from app.settings import SafetyLimits
from app.telemetry.series import SeriesBank


class RampRun:
    """A running ramp: ``spec`` (rig seconds), ``record`` (how it is recorded; None: not),
    ``safety`` (its stops; None: none)."""

    def __init__(self, spec: RampSpec, record: RecordSpec | None, safety: SafetyLimits | None) -> None:
        self.spec = spec
        self.record = record
        self.safety = safety
        self.gen: LoadGenerator | None = None
        self.recorder: RunRecorder | None = None  # the run this ramp opened (None: recorded in the open run, or not)
        self.steps: list[StepStats] = []
        self.safety_reason: str | None = None
        self.abort_reason: str | None = None
        self.aborted = threading.Event()
        self.done = threading.Event()
        self.outcome: RampOutcome | None = None
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()

    def check_safety(self, bank: SeriesBank, server_failed: bool) -> str | None:
        """The ramp thread, every :data:`app.run.safety.CHECK_INTERVAL_S`: the thermal
        limit (from ``bank``'s card temperatures) and a failed server (``server_failed``)
        abort the load. Returns the thermal stop's reason the first time it trips, else
        None."""
        s, tripped = self.safety, None
        if s is not None and s.enabled and not self.safety_reason:
            reason = thermal_stop_reason(bank, s.thermal_margin_c)
            if reason:
                with self.lock:
                    self.safety_reason = tripped = reason
                self.aborted.set()
                if self.gen is not None:
                    self.gen.abort()
        if server_failed and self.gen is not None:
            self.gen.abort()
        return tripped

    def ended_by_server(self, res: RampResult, status: str, server_failed: bool) -> bool:
        """Whether the ramp's end may be the server's doing: it failed (``server_failed``),
        or stopped on a failure-rate or generator error — not an abort asked for by the
        user, and not a pre-flight failure with no request sent (an unreachable URL is not
        a death)."""
        if server_failed:
            return status not in OK_STATUSES
        if status in OK_STATUSES or (status == "aborted" and self.abort_reason):
            return False
        return bool(res.records)
