"""One headless run of a profile (``vllm-dyno run PROFILE``): plan → launch → ready →
ramp → record → stop, driven through the :class:`~app.run.controller.RunController`
like every other front end (same safety stops from Settings, same stored rows, same
summary as a ramp started from the window).

The run is opened in the run store before the launch, so a failed launch is recorded
too; ``runs.summary`` is :func:`app.run.record.run_summary`.
"""
from __future__ import annotations

import enum
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from app.clock import SessionClock
from app.config import ServerConfig
from app.hosts.link import SshOptions
from app.loadgen.spec import RampSpec
from app.loadgen.stats import Knee, StepStats
from app.planner.launch_defaults import LaunchDefaults
from app.planner.models import resolve_model
from app.planner.plan import Plan, Workload, plan_for
from app.profiles.env_policy import EnvRefused, screen_env
from app.profiles.model import HardwareFingerprint, Profile, ResultsSummary
from app.run.controller import OK_STATUSES, LaunchTarget, RampOutcome, RecordSpec, RunController, RunListener, State
from app.run.record import RunRecorder
from app.run.safety import NoSafety
from app.run.target import launch_target
from app.run.verdict import Verdict
from app.server.launch import LaunchError
from app.server.supervisor import Supervisor
from app.settings import SafetyLimits
from app.store import RunStore

log = logging.getLogger(__name__)


class Phase(str, enum.Enum):
    PLANNING = "planning"
    LAUNCHING = "launching"
    LOADING = "loading"
    READY = "ready"
    RAMPING = "ramping"
    STOPPING = "stopping"
    DONE = "done"
    FAILED = "failed"
    ABORTED = "aborted"


@dataclass
class RunResult:
    """The outcome. ``status``: the ramp's (``done``, ``slo_broken``, ``failed``,
    ``stopped``, ``safety``, ``aborted``, ``error``) or ``launch_failed`` / ``plan_error`` /
    ``server_failed``; ``reason``: one line for humans (a launch failure with its
    diagnosis); ``run_id``: the recorded run (None when nothing was recorded, i.e.
    ``plan_error``, or when the store could not take it: ``unsaved`` then names the path
    and the cause). Level stats and the knee in rig seconds."""

    status: str
    reason: str = ""
    run_id: int | None = None
    steps: list[StepStats] = field(default_factory=list)
    knee: Knee | None = None
    plan: dict[str, Any] | None = None
    capacity: dict[str, Any] | None = None
    hardware: HardwareFingerprint | None = None
    results: ResultsSummary | None = None
    time_scale: float = 1.0
    verdict: Verdict | None = None
    outcome: RampOutcome | None = None
    outcome_spec: RampSpec | None = None  # the RampSpec the ramp ran (rig seconds)
    unsaved: str | None = None

    @property
    def ok(self) -> bool:
        """True when the ramp ran to an orderly end (all levels, an SLO stop or its cap)."""
        return self.status in OK_STATUSES


def _added_options(before: ServerConfig, after: ServerConfig) -> dict[str, Any]:
    """The vLLM options ``after`` sets that ``before`` (a ServerConfig) did not set or set
    otherwise, as a profile's ``server:`` keys."""
    old = before.to_vllm_config()
    return {k: v for k, v in after.to_vllm_config().items() if k != "model" and old.get(k) != v}


def plan_profile(profile: Profile, vllm_version: str | None = None) -> Plan | None:
    """The planner's :class:`~app.planner.plan.Plan` of ``profile`` on its own hardware
    (the rig for engine sim, ``profile.hardware`` otherwise), for the ramp's request
    shape. Returns None when the profile names no hardware. Raises the planner's errors
    (ModelNotFoundError, UnknownGpuError, ValueError). A rig of several hosts (the sim's
    ``hosts``/``link``, or the hardware's) is planned with its inter-host link
    (:meth:`HardwareFingerprint.rig_layout`)."""

    hw = profile.hardware
    if profile.engine.simulated and profile.sim is not None:
        hw = HardwareFingerprint(gpu=profile.sim.gpu, count=profile.sim.count, hosts=profile.sim.hosts,
                                 link=profile.sim.link)
    if hw is None:
        return None
    cfg = profile.server_config()
    wl = Workload.from_ramp(profile.ramp)  # the ramp's levels, lengths, warm-up and SLO are predicted
    acceptance = profile.sim.spec_acceptance if profile.engine.simulated and profile.sim is not None else None
    # the engine's vLLM rules and calibration (the sim's pinned rules, its own step times), as the window plans it
    return plan_for(profile.engine, cfg, hw.planner_cards(), resolve_model(cfg.model), wl, vllm_version,
                    spec_acceptance=acceptance, rig=hw.rig_layout())


class _Listener(RunListener):
    def __init__(self, run: "ProfileRun") -> None:
        self.run = run

    def on_state(self, state: State, reason: str) -> None:
        if state == State.LOADING:
            self.run._set_phase(Phase.LOADING)

    def on_line(self, stream: str, text: str, t: float) -> None:
        if self.run.on_line is not None:
            self.run.on_line(stream, text, t)

    def on_level_start(self, ev: dict) -> None:
        if self.run.on_level_start is not None:
            self.run.on_level_start(ev)

    def on_records(self, records: list) -> None:
        if self.run.on_records is not None:
            self.run.on_records(records)

    def on_level(self, st: StepStats) -> None:
        if self.run.on_level is not None:
            self.run.on_level(st)

    def on_safety_stop(self, reason: str) -> None:
        self.run._set_phase(Phase.RAMPING, reason)

    def on_launch_defaults(self, defaults: LaunchDefaults) -> None:
        if self.run.on_defaults is not None:
            self.run.on_defaults(defaults)

    def on_rig_part(self, part: dict) -> None:
        if self.run.on_part is not None:
            self.run.on_part(part)


class ProfileRun:
    """One run of ``profile``.

    ``store``: a RunStore (None → the default one, opened and closed by the run).
    ``python``: the vLLM interpreter (engine vllm). ``ramp_overrides``: RampSpec fields
    to change for this run (e.g. ``{"levels": [1, 2], "step_seconds": 5}``; rig seconds
    for a time-scaled sim). ``force``: launch even when the planner's verdict is
    ``error``. ``telemetry``: sample GPUs (NVML or the sim rig), host and ``/metrics``.
    ``safety``: the SafetyLimits to run with (None → the user's Settings, as the window
    uses; :data:`app.run.safety.NO_SAFETY`: none — see :meth:`RunController.start_ramp`).
    ``startup_timeout`` and ``grace`` in seconds (see app.server.supervisor).
    ``trusted_env``: the ``env:`` pairs the user confirmed (``--trust-env``, their own
    ``--env``); any other key a shared profile may not set makes the run
    ``launch_failed`` before anything starts (app.profiles.env_policy); ``builtin``: the
    profile ships with vLLM Dyno (a verified allocator ``LD_PRELOAD`` is kept). ``expose``:
    the user confirmed a ``host`` beyond loopback (else such a launch is refused).
    :meth:`run` blocks; call :meth:`abort` from another thread to stop early (what was
    recorded is kept). Subscribers (called on worker threads): ``on_phase(phase, msg)``,
    ``on_line(stream, text, t)``, ``on_level_start(dict)``, ``on_level(StepStats)``,
    ``on_records(list)``, ``on_defaults(LaunchDefaults)`` (the CPU build's working
    defaults filled in before the plan, :meth:`app.run.controller.RunController.launch_defaults`;
    for a rig, by each host's agent as its part starts, ``LaunchDefaults.host`` naming it),
    ``on_part(dict)`` (a rig's host part started, :meth:`app.run.events.RunListener.on_rig_part`).
    A profile with ``hosts:`` (two or more) launches over them through their agents;
    ``ssh``: how they are reached (:class:`app.hosts.link.SshOptions`; None: the user's SSH
    agent, config and known hosts); :meth:`rig_status` is each host's state.
    """

    def __init__(self, profile: Profile, *, store: RunStore | None = None, python: str | None = None,
                 clock: SessionClock | None = None,
                 ramp_overrides: dict[str, Any] | None = None, force: bool = False, telemetry: bool = True,
                 use_planner: bool = True, safety: SafetyLimits | NoSafety | None = None,
                 startup_timeout: float = 900.0,
                 grace: float = 20.0, expose: bool = False, on_phase: Callable[[Phase, str], None] | None = None,
                 on_line: Callable[[str, str, float], None] | None = None,
                 on_level_start: Callable[[dict], None] | None = None,
                 on_level: Callable[[StepStats], None] | None = None,
                 on_records: Callable[[list], None] | None = None,
                 on_defaults: Callable[[LaunchDefaults], None] | None = None,
                 on_part: Callable[[dict], None] | None = None,
                 trusted_env: Mapping[str, str] | None = None, builtin: bool = False,
                 ssh: SshOptions | None = None) -> None:
        self.profile = profile
        self.trusted_env = dict(trusted_env or {})
        self.builtin = builtin
        self.ramp_overrides = dict(ramp_overrides or {})
        self.force = force
        self.use_telemetry = telemetry
        self.use_planner = use_planner
        self.python = python
        self.startup_timeout = startup_timeout
        self.grace = grace
        self.expose = expose
        self.safety = safety  # None: the controller reads the user's Settings when the ramp starts
        self.on_phase, self.on_line, self.on_level_start = on_phase, on_line, on_level_start
        self.on_level, self.on_records, self.on_defaults, self.on_part = on_level, on_records, on_defaults, on_part
        self.ssh = ssh
        self.phase = Phase.PLANNING
        self.plan: Plan | None = None
        self.controller = RunController(store=store, listener=_Listener(self), clock=clock)
        self._abort = threading.Event()

    @property
    def supervisor(self) -> Supervisor | None:
        """The server's supervisor (kept after the stop)."""
        c = self.controller
        return c.supervisor or c.last_supervisor

    def rig_status(self) -> list[dict[str, Any]]:
        """Each host of the rig: role, state, clock offset … (``[]`` for one machine),
        :meth:`app.run.controller.RunController.rig_status`."""
        return self.controller.rig_status()

    @property
    def run_id(self) -> int | None:
        rec = self.controller.run
        return rec.run_id if rec is not None else self._run_id

    _run_id: int | None = None
    _rec: RunRecorder | None = None  # the run's recorder, once opened

    def abort(self) -> None:
        """Stop the run as soon as possible (thread-safe, idempotent)."""
        self._abort.set()
        self.controller.abort_ramp("aborted by the user")
        self.controller.stop_waiting()  # a launch in progress stops waiting

    @property
    def aborted(self) -> bool:
        return self._abort.is_set()

    def _set_phase(self, phase: Phase, message: str = "") -> None:
        self.phase = phase
        if self.on_phase is not None:
            try:
                self.on_phase(phase, message)
            except Exception:
                log.exception("phase subscriber failed")

    def make_plan(self) -> dict[str, Any] | None:
        """Run the planner (see :func:`plan_profile`); returns ``plan.as_dict()`` or a
        ``{"verdict": "unknown", "error": …}`` mapping when the planner cannot plan."""
        if not self.use_planner:
            return None
        try:
            self.plan = plan_profile(self.profile)
        except Exception as e:  # unknown model/GPU: a run is still possible
            return {"verdict": "unknown", "error": f"{type(e).__name__}: {e}"}
        return None if self.plan is None else self.plan.as_dict()

    def run(self) -> RunResult:
        """Plan, launch, wait for ready, ramp, record, stop. Never leaves a process
        running; returns the :class:`RunResult` (errors become its status)."""
        self._rec = None
        try:
            res = self._run()
        finally:
            self.controller.close()  # a last try to save a run the store refused
        rec = self._rec
        if rec is not None:
            res.run_id = rec.run_id if rec.saved else None
            res.unsaved = None if rec.saved else rec.problem
        return res

    def _run(self) -> RunResult:
        scr = screen_env(self.profile.env, trusted=self.trusted_env, builtin=self.builtin)
        try:
            env = scr.check()
        except EnvRefused as e:
            self._set_phase(Phase.FAILED, str(e))
            return RunResult("launch_failed", str(e))
        for note in scr.notes:
            log.warning("%s: %s", self.profile.name, note)
        if env != self.profile.env:
            self.profile = self.profile.updated(env=env)
        ctl = self.controller
        self._set_phase(Phase.PLANNING)
        # the CPU build's working defaults, before the plan and the record see the profile
        target = ctl.launch_defaults(launch_target(
            profile=self.profile, python=self.python, telemetry=self.use_telemetry, startup_timeout=self.startup_timeout,
            grace=self.grace, expose=self.expose, ssh=self.ssh))
        before = self.profile.server_config()
        if target.config != before:
            self.profile = self.profile.updated(
                server={**self.profile.server, **_added_options(before, target.config)},
                env={**self.profile.env, **target.config.env})
        prof = self.profile
        plan = self.make_plan()
        if plan is not None and plan.get("verdict") == "error" and not self.force:
            msg = "; ".join(f["message"] for f in plan.get("findings", []) if f["verdict"] == "error")
            self._set_phase(Phase.FAILED, msg)
            return RunResult("plan_error", f"the planner says this cannot work: {msg} "
                                           "(fix the profile, or run with force)", plan=plan)
        self._run_id = ctl.open_run(RecordSpec(profile=prof, plan=plan))
        res = RunResult("error", run_id=self._run_id, plan=plan)
        try:
            self._launch_and_ramp(target, res)
        except Exception as e:  # an unexpected failure still stops everything and is recorded
            log.exception("run failed")
            res.status, res.reason = "error", f"{type(e).__name__}: {e}"
        self._set_phase(Phase.STOPPING)
        ctl.stop(reason="aborted by the user" if self.aborted else None)
        sup = self.supervisor
        if sup is not None:
            res.capacity = sup.parser.facts.as_dict()
        if ctl.failure is not None and res.status not in ("launch_failed",) and not res.ok:
            res.status, res.reason = "server_failed", ctl.failure_text
        if self.aborted and res.status not in ("launch_failed",):
            res.status, res.reason = "aborted", res.reason if res.status == "aborted" and res.reason \
                else "aborted by the user"
        rec = self._rec = ctl.run
        if rec is not None:
            res.hardware, res.time_scale = rec.hardware, rec.time_scale
        closed = ctl.close_run(res.status, res.reason, res.knee, outcome=res.outcome)
        if closed is not None:
            res.results = closed[1]
        final = Phase.DONE if res.ok else (Phase.ABORTED if res.status == "aborted" else Phase.FAILED)
        self._set_phase(final, res.reason)
        return res

    def _launch_and_ramp(self, target: LaunchTarget, res: RunResult) -> None:
        ctl, prof = self.controller, self.profile
        if target.engine.launches:
            self._set_phase(Phase.LAUNCHING)
        try:
            ctl.launch(target, check_leftovers=False)
        except (LaunchError, ValueError) as e:
            res.status, res.reason = "launch_failed", str(e)
            return
        while not ctl.wait_ready(0.5):
            if self.aborted or ctl.state in (State.FAILED, State.STOPPED, State.IDLE):
                break
        if not ctl.ready:
            if not self.aborted:
                res.status, res.reason = "launch_failed", ctl.failure_text or f"server {ctl.state.value}"
            return
        self._set_phase(Phase.READY, ctl.url or "")
        if self.aborted:
            return
        self._set_phase(Phase.RAMPING)
        url = ctl.url
        assert url is not None  # ready: the server's URL is known
        spec = res.outcome_spec = prof.ramp_spec(url, ctl.api_model, **self.ramp_overrides)
        ctl.start_ramp(spec, safety=self.safety)
        if self.aborted:  # an abort between the check above and the start found no ramp to stop
            ctl.abort_ramp("aborted by the user")
        out = ctl.wait_ramp()
        assert out is not None
        res.steps, res.knee, res.time_scale = out.steps, out.knee, out.time_scale
        res.status, res.reason = out.status, out.stop_reason
        res.outcome, res.verdict = out, out.verdict
