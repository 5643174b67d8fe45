"""Launch progress: the phase a launch is in, how long it has run, and — after a first
launch of the same configuration — how long it has left (issue 19, item 3).

The phases come from the server's log (:data:`app.server.logparse.LAUNCH_PHASES`:
engine → weights → profile → kv_cache → graphs → api → ready); their start times are
session-clock seconds. A launch that became ready is kept in the run store
(``launches``: key, seconds to ready, each phase's start after the launch began); the
next launch of the same key is timed against the median of the last ones.

The expected remaining time is aligned to the phase the launch is in: the previous
launches' time from this phase's start to ready, less the time spent in it so far. A
phase that runs longer than before gives "longer than the last launches" instead of a
negative time.
"""
from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import dataclass, field
import logging
from typing import TYPE_CHECKING, Any, Callable

from app.server.logparse import PHASE_KEYS, PHASE_LABELS

if TYPE_CHECKING:  # types only: the store and the supervisor are handed in
    from app.server.supervisor import Supervisor
    from app.store import RunStore

log = logging.getLogger(__name__)

#: how many earlier launches of a configuration the estimate uses (their median)
HISTORY = 5


def launch_key(engine: str, config: Any, sim_args: list[str] | None = None, python: str | None = None) -> str:
    """What makes two launches "the same configuration": the engine, the server's
    options except where it listens (host, port), the sim rig's options and the
    interpreter. ``config``: an :class:`app.config.ServerConfig`. A hex digest."""
    opts = config.model_dump(mode="json", exclude={"host", "port"}) if hasattr(config, "model_dump") else dict(config)
    data = {"engine": engine, "config": opts, "sim": [a for a in (sim_args or [])], "python": python or ""}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:32]


def expected_phases(history: list[dict[str, Any]]) -> dict[str, float] | None:
    """The median start of each phase and of ready (key ``ready``) over ``history``
    (rows of :meth:`app.store.RunStore.launches`), seconds after the launch began; None
    without history."""
    if not history:
        return None
    out: dict[str, float] = {}
    for key in PHASE_KEYS:
        vals = [float(h["phases"][key]) for h in history if key in (h.get("phases") or {})]
        if vals:
            out[key] = statistics.median(vals)
    out["ready"] = statistics.median(float(h["ready_s"]) for h in history)
    return out


@dataclass
class LaunchProgress:
    """Where a launch is. Seconds throughout; ``phases``: (key, label, start after the
    launch began) of every phase reached so far, in order."""

    phase: str | None
    label: str
    elapsed_s: float
    phase_elapsed_s: float
    phases: list[tuple[str, str, float]] = field(default_factory=list)
    #: the median seconds to ready of the earlier launches of this configuration
    expected_total_s: float | None = None
    #: seconds left by that estimate (None without history; 0 when past it)
    remaining_s: float | None = None
    #: the launch is slower than the earlier ones (in this phase or in total)
    overdue: bool = False

    def text(self) -> str:
        """One line: "loading weights · 12 s · about 40 s left (last launches: 52 s)"."""
        parts = [self.label, f"{self.elapsed_s:.0f} s"]
        if self.expected_total_s is not None:
            if self.overdue:
                parts.append(f"longer than the last launches ({_dur(self.expected_total_s)})")
            else:
                parts.append(f"about {_dur(self.remaining_s or 0.0)} left (last launches: "
                             f"{_dur(self.expected_total_s)})")
        return " · ".join(parts)


def _dur(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.1f} min"


def progress(phase: str | None, phase_times: dict[str, float], started_t: float, now: float,
             expected: dict[str, float] | None = None) -> LaunchProgress:
    """The progress of a launch that began at ``started_t`` (session clock) and has
    reached ``phase`` (None: no phase line yet, the process is starting), given the
    phases' start times ``phase_times`` (same clock) and the ``expected`` phase starts
    of :func:`expected_phases`."""
    elapsed = max(0.0, now - started_t)
    reached = [(k, PHASE_LABELS[k], max(0.0, phase_times[k] - started_t)) for k in PHASE_KEYS if k in phase_times]
    label = PHASE_LABELS[phase] if phase else "starting the process"
    phase_start = next((s for k, _, s in reached if k == phase), 0.0) if phase else 0.0
    p = LaunchProgress(phase, label, elapsed, max(0.0, elapsed - phase_start), reached)
    if expected and "ready" in expected:
        total = expected["ready"]
        p.expected_total_s = total
        if phase == "ready":
            p.remaining_s = 0.0
        else:
            # aligned to this phase's start when the earlier launches reached it too
            if phase is not None and phase in expected:
                left = total - expected[phase] - p.phase_elapsed_s
            else:
                left = total - elapsed
            p.remaining_s = max(0.0, left)
            p.overdue = left < 0
    return p


class LaunchTimer:
    """The timing of a session's launch: ``key`` (:func:`launch_key`; None before a
    launch), ``expected`` (the earlier ready launches' phase starts, s after the launch
    began, :func:`expected_phases`; None: no earlier launch) and the last phase seen."""

    def __init__(self) -> None:
        self.key: str | None = None
        self.expected: dict[str, float] | None = None
        self.phase_seen: str | None = None

    def load(self, store: "Callable[[], RunStore]", engine: str, config: Any, sim_args: list[str] | None,
             python: str | None) -> None:
        """A launch begins: the earlier ready launches of this configuration from the run
        store (``store()``, opened on first use), for the expected time left (a store that
        cannot be opened or read only means no estimate)."""
        self.phase_seen = None
        self.key = launch_key(engine, config, sim_args, python)
        try:
            self.expected = expected_phases(store().launches(self.key, HISTORY))
        except Exception as e:  # the estimate is a help: a store problem must not stop a launch
            log.debug("no launch history: %s", e)
            self.expected = None

    def save(self, store: "Callable[[], RunStore]", engine: str, sup: "Supervisor", now: float) -> None:
        """The launch of ``sup`` became ready at ``now`` (session-clock s): keep its phase
        times in the run store (``store()``) for the next launch of it."""
        if self.key is None or sup.started_t is None:
            return
        try:
            store().add_launch(self.key, engine, max(0.0, now - sup.started_t), sup.launch_phases())
        except Exception as e:  # a full or read-only store: the next launch has no estimate, nothing else
            log.info("launch time not kept: %s", e)

    def progress(self, sup: "Supervisor | None", now: float) -> LaunchProgress | None:
        """Where the launch of ``sup`` is at ``now`` (:func:`progress`); None without a
        launched server."""
        if sup is None or sup.started_t is None:
            return None
        f = sup.parser.facts
        return progress(f.phase, dict(f.phase_times), sup.started_t, now, self.expected)

    def new_phase(self, sup: "Supervisor | None") -> bool:
        """Whether the log of ``sup`` entered another phase since the last call."""
        if sup is None or sup.parser.facts.phase == self.phase_seen:
            return False
        self.phase_seen = sup.parser.facts.phase
        return True
