"""The tune: measure, calibrate, re-rank — a few launches, not a grid (issue 18, items 3–4, 6).

:class:`Tuner` runs a :class:`TuneSpec` through one :class:`app.run.controller.RunController`
(the GUI's, so its live plots follow every launch; or its own):

1. enumerate the candidates (:func:`app.tuner.space.enumerate_candidates`: the planner
   prunes what cannot start and says why) and predict each one's users at the SLO
   (:mod:`app.tuner.model`: screen, then the step-level engine for the best);
2. launch the best predicted candidate that is not measured yet, run the capacity search
   from its predicted users (the same search ``vllm-dyno ramp --find-capacity`` runs,
   recorded as a run), refit the rig's factors to every measurement and re-predict
   every candidate;
3. go on only while a candidate is predicted to beat the best measured one by more than
   the measurement's spread (half its interval, at least the search's resolution), within
   the budget (launches, minutes; one launch is kept for step 4); a candidate predicted at
   least as good as the best measured but within that spread (a tie the model cannot
   break) is measured too while spare launches remain;
4. confirm: launch the best measured candidate with ``max_num_seqs`` set from its
   capacity (:func:`app.tuner.space.recommended_max_num_seqs`) and search again from
   there: the recommendation's users, verdict and flags are those of this launch.

Every search runs with the user's safety stops (Settings, applied by the run controller to
every ramp: :mod:`app.run.safety`); a thermal stop ends the tune — no further launch —
with the controller's sentence as its ``stop_reason`` (``TuneState.safety_stop``).

Objectives (score, higher is better): ``users`` (users at the SLO), ``throughput``
(output tokens/s at that level), ``cost`` (GPU-hours per million output tokens there:
:func:`app.telemetry.derived.cost_per_mtok` with Settings' prices, cards × hours without
a price), ``energy`` (J per output token: measured from the cards' power, predicted as the
cards' board power ÷ tokens/s — an upper bound, the same for every candidate).

The state (:class:`TuneState`) is written to the run store after every step
(``tunes`` table); :meth:`Tuner.resume` continues an interrupted tune where it stopped
(a launch cut off is run again). Times: rig seconds (the sim's clock: wall × its time
scale) and wall seconds.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import asdict
from typing import Any, Callable, Literal, Optional, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.config import ServerConfig
from app.engines import TUNABLE, CardSamples, Engine, names
from app.hosts.link import SshOptions
from app.hosts.spec import Host
from app.loadgen.capacity import P99_MIN_REQUESTS, SEARCH_STEP_CAP_S
from app.loadgen.capacity import Capacity, crossing_users
from app.loadgen.spec import SLO, CapacitySearch, RampSpec
from app.loadgen.workload import Workload as WorkloadModel
from app.loadgen.stats import StepStats
from app.planner.calibrate import MeasuredLevel
from app.planner.model_error import CPU as CPU_CLASS, card_class, statement as error_statement
from app.planner.models import resolve_model
from app.planner.plan import Plan, Workload, check
from app.profiles.model import HardwareFingerprint
from app.run.controller import RecordSpec, RunController
from app.run.target import launch_target
from app.run.verdict import Tried, Verdict, against_tune
from app.server.launch import LaunchError
from app.settings import Pricing
from app.telemetry.derived import cost_per_mtok
from app.tuner import model as rig_model
from app.tuner.space import (Candidate, TuneSpace, enumerate_candidates, recommended_max_num_seqs, rig_refusal,
                             server_flags)

log = logging.getLogger(__name__)

Objective = Literal["users", "throughput", "cost", "energy"]
OBJECTIVES = ("users", "throughput", "cost", "energy")


#: the tune's search resolution (a fraction of the users): finer than a lone capacity
#: search's 10 % (app.loadgen.spec.CapacitySearch), as the tuner compares candidates a few
#: per cent apart — at 10 % three configurations 8 % apart (49, 50 and 53 users) all
#: measured "50" and the pick was left to chance (benchmarks/tuner_vs_grid.py, case 3:
#: 0.93 of the grid's best at 10 %, 1.00 at 5 %); it costs about one more level a search
TUNE_RESOLUTION = 0.05


def _or_lowest(score: float | None) -> float:
    """A score to order by: None (not scored) below every score."""
    return -math.inf if score is None else score


class TuneSpec(WorkloadModel):
    """What to tune. ``engine`` a tunable :class:`app.engines.Engine`: ``vllm`` (this
    machine's cards or the CPU build) or ``sim`` (``sim_args``: the rig's options); ``config`` the starting flags (the
    profile's); ``hardware`` the cards (the planner's view of them); the workload
    (a :class:`app.loadgen.workload.Workload`, inherited: its fields are the tune's, flat in
    its JSON — the lengths, seed, dataset, shared prefix, multi-turn —, predicted and measured
    alike; a tune's searches are closed-loop) and ``slo`` every capacity is judged on; ``objective``; ``space`` what may vary; the
    budget: ``max_launches`` (the confirming launch included) and ``max_minutes`` (wall);
    the search: ``requests_per_level`` (p99 floor), ``resolution`` (:data:`TUNE_RESOLUTION`).
    ``hosts``: the rig of two or more hosts every launch goes over (the profile's
    ``hosts:``; their agents, :class:`app.run.handles.RigHandle`) and
    ``ray_address`` the Ray cluster the Ray backend attaches to — stored with the tune, so
    ``--resume`` relaunches on the same hosts (no secret: :class:`app.hosts.spec.Host`
    refuses them; how the hosts are reached, SSH options, is not stored: the resuming
    command gives it); ``hardware`` is then the rig's cards (``hosts``/``link`` set)."""

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    engine: Engine = Engine.SIM
    config: ServerConfig
    sim_args: list[str] = Field(default_factory=list)
    hardware: HardwareFingerprint
    python: Optional[str] = None
    vllm_version: Optional[str] = None
    slo: SLO
    objective: Objective = "users"
    space: TuneSpace = Field(default_factory=TuneSpace)
    max_launches: int = Field(4, ge=1, le=100)
    max_minutes: Optional[float] = Field(None, gt=0)
    requests_per_level: int = Field(P99_MIN_REQUESTS, ge=1)
    resolution: float = Field(TUNE_RESOLUTION, gt=0, lt=1)
    max_users: float = Field(1024.0, ge=1, description="the highest level a search probes")
    startup_timeout: float = Field(900.0, gt=0)
    grace: Optional[float] = Field(None, gt=0)
    hosts: list[Host] = Field(default_factory=list)
    ray_address: Optional[str] = None

    @field_validator("engine", mode="before")
    @classmethod
    def _engine(cls, v: Any) -> Engine:
        e = Engine.parse(v)
        if e is None or not e.spec.tunable:
            raise ValueError(f"engine {v!r}: a tune launches its servers on {names(TUNABLE)}")
        return e

    @model_validator(mode="after")
    def _closed_loop(self) -> "TuneSpec":
        self.check_kinds("concurrency")  # a tune's capacity searches are closed-loop
        return self

    @property
    def multi_host(self) -> bool:
        """Launches over two or more hosts (their agents), not one local server."""
        return len(self.hosts) >= 2

    def candidates(self, workload: Workload | None = None) -> list[Candidate]:
        """Every configuration of the space, checked by the planner on the rig's cards and
        link (:meth:`HardwareFingerprint.rig_layout`) and, over hosts, by the rig's launch
        plan (:func:`app.tuner.space.enumerate_candidates`). Raises ValueError naming the
        input. ``workload``: :meth:`workload`, when the caller has it."""
        return enumerate_candidates(self.config, self.hardware.planner_cards(), self.space,
                                    workload or self.workload(),
                                    self.vllm_version, fewer_cards=self.objective in ("cost", "energy"),
                                    rig=self.hardware.rig_layout(), hosts=self.hosts if self.multi_host else None,
                                    ray_address=self.ray_address)

    def workload(self) -> Workload:
        """The planner's workload of this tune (its capacity search is the one measured):
        the tune's requests, unchanged."""
        return Workload(self.as_workload(), (1,), slo=self.slo,
                        search=CapacitySearch(resolution=self.resolution, max_level=self.max_users),
                        requests_per_level=self.requests_per_level)


class CandidateResult(BaseModel):
    """A candidate in the tune's state: its flags (``server``), the planner's reason
    when pruned, the screen's estimate, the first prediction (default parameters) and
    the current one (fitted factors), and what its launch measured (or why it failed)."""

    key: str
    checkpoint: str = ""
    cards: int = 1
    server: dict[str, Any] = Field(default_factory=dict)
    pruned_because: Optional[str] = None
    screen_users: Optional[float] = None
    first_predicted_users: Optional[float] = None
    predicted_users: Optional[float] = None
    predicted_tps: Optional[float] = None
    predicted_low: Optional[float] = None
    predicted_high: Optional[float] = None
    #: the uncertainty of ``predicted_users`` (a log sd: the measurements' correction,
    #: app.tuner.model.corrections): ~0 for a measured family, the model's residual for another
    predicted_sd: Optional[float] = None
    measured_users: Optional[float] = None
    measured_low: Optional[float] = None
    measured_high: Optional[float] = None
    measured_tps: Optional[float] = None
    #: where its SLO's tightest p99 crossed the bound between the capacity level and the
    #: first broken one (app.loadgen.capacity.crossing_users), users: the tie-break
    measured_crossing: Optional[float] = None
    j_per_token: Optional[float] = None
    run_id: Optional[int] = None
    failed: Optional[str] = None
    levels: list[dict] = Field(default_factory=list)  # MeasuredLevel fields of each measured level

    @property
    def measured(self) -> bool:
        return self.measured_users is not None and self.failed is None


class LaunchRecord(BaseModel):
    """One launch of the tune: ``purpose`` ``measure`` or ``confirm``, its candidate,
    run, outcome and cost (rig and wall seconds, start-up included)."""

    n: int
    key: str
    purpose: Literal["measure", "confirm"] = "measure"
    run_id: Optional[int] = None
    status: str = "running"
    users: Optional[float] = None
    users_low: Optional[float] = None
    users_high: Optional[float] = None
    output_tps: Optional[float] = None
    rig_seconds: float = 0.0
    wall_seconds: float = 0.0
    error: Optional[str] = None
    sentence: str = ""
    #: the run's verdict (app.run.verdict.Verdict fields): its next step is held against the
    #: tune's candidates when the recommendation is written (issue 37 item 4)
    verdict: Optional[dict[str, Any]] = None


class TuneState(BaseModel):
    """Everything a resume needs and every figure the result shows."""

    candidates: list[CandidateResult] = Field(default_factory=list)
    factors: dict[str, float] = Field(default_factory=dict)
    residual: float = 1.0  # measured ÷ predicted users, geometric mean over the measured
    #: the model's error for a family not measured (a log sd: app.tuner.model.family_spread)
    uncertainty: Optional[float] = None
    launches: list[LaunchRecord] = Field(default_factory=list)
    phase: str = "measure"  # measure → confirm → done
    stop_reason: str = ""
    #: the run controller's sentence when a launch's search hit a safety stop (a card within
    #: Settings' margin of its slowdown temperature, app.run.safety): the tune launches no more
    safety_stop: Optional[str] = None
    recommendation: Optional[dict[str, Any]] = None
    runner_up: Optional[dict[str, Any]] = None
    baseline: Optional[dict[str, Any]] = None
    wall_seconds: float = 0.0

    @property
    def rig_seconds(self) -> float:
        return sum(x.rig_seconds for x in self.launches)

    def by_key(self, key: str) -> CandidateResult | None:
        return next((c for c in self.candidates if c.key == key), None)


class TuneListener:
    """Progress of a tune, called on the tuner's thread: ``on_progress(state, message)``
    after every step (candidates predicted, launch started, measured, refit, done)."""

    def on_progress(self, state: TuneState, message: str) -> None:
        pass


class TuneAborted(Exception):
    """The tune was stopped (Ctrl-C, the window's Stop): its state is saved as interrupted."""


def _fmt_iv(lo: float | None, hi: float | None) -> str:
    return f"{lo:g}–{hi:g}" if lo is not None and hi is not None else "no interval"


def launch_search(spec: TuneSpec, workload: Workload, start: float) -> RampSpec:
    """The capacity search a tune runs on each launch — and the Tune tab's "Verify (find
    capacity)" runs again (app.tuner.report.verify_ramp): ``workload``'s search
    (:meth:`TuneSpec.workload`) from ``start`` users (whole, within [1, max_users]) at the
    tune's resolution, each level capped at :data:`SEARCH_STEP_CAP_S` rig seconds."""
    out = workload.search_spec()
    assert out is not None  # a tune has an SLO
    return out.model_copy(update={"search": CapacitySearch(start=min(spec.max_users, max(1.0, math.floor(start))),
                                                           resolution=spec.resolution, max_level=spec.max_users),
                                  "step_seconds": SEARCH_STEP_CAP_S})


def score(objective: str, users: float | None, tps: float | None, cards: int, board_w: float,
          j_per_token: float | None = None, pricing: Pricing | None = None) -> float | None:
    """A configuration's score for ``objective``, higher is better (module docstring);
    None when it cannot be scored (no users at the SLO, no throughput)."""
    if users is None or users <= 0:
        return None
    if objective == "users":
        return float(users)
    if not tps or tps <= 0:
        return None
    if objective == "throughput":
        return float(tps)
    if objective == "cost":
        rented, energy = cost_per_mtok(tps, cards, j_per_token, pricing or Pricing())
        if rented is not None or energy is not None:
            return -((rented or 0.0) + (energy or 0.0))
        return -(cards * 1e6 / (tps * 3600))  # GPU-hours per million tokens
    j = j_per_token if j_per_token is not None else cards * board_w / tps
    return -j


class Measurement(BaseModel):
    """What one launch and capacity search gave: ``status`` ``done`` or why not
    (``launch_failed``, a ramp status), ``error`` in words, the recorded ``run_id``,
    ``rig_seconds`` (start-up included), the search's ``capacity``, its levels
    (``steps``, rig s) and ``verdict``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    status: str
    error: Optional[str] = None
    run_id: Optional[int] = None
    rig_seconds: float = 0.0
    capacity: Optional[Capacity] = None
    steps: list[StepStats] = Field(default_factory=list)
    verdict: Optional[Verdict] = None


class MeasuringRig(Protocol):
    """What the tuner measures a configuration on — a rig, not an engine (app.engines):
    :class:`ControllerRig` launches it through the run controller on the spec's engine;
    :class:`app.tuner.offline.OfflineRig` (benchmarks, tests) runs the search on the
    step-level engine of a hidden "true rig", with no server. ``measure`` runs the
    capacity search ``ramp`` on configuration ``cfg`` (recorded with ``record`` where
    anything runs), calling ``check_abort`` while it waits."""

    def measure(self, cfg: ServerConfig, ramp: RampSpec, record: RecordSpec,
                check_abort: Callable[[], None]) -> Measurement: ...


class ControllerRig:
    """The rig the tuner measures on: launches through a :class:`RunController` (the
    engine, sim rig, interpreter, hosts and timeouts of ``spec``), runs the search, stops
    the server. ``ssh``: how ``spec.hosts`` are reached (:class:`app.hosts.link.SshOptions`;
    None: the user's SSH agent, config and known hosts); ``expose``: the user confirmed a
    server beyond loopback (``--expose``, the window's dialog) — a rig's head binds its
    address, so a launch over hosts is refused without it. ``check_abort`` is called
    while it waits; it raises to stop."""

    def __init__(self, spec: TuneSpec, controller: RunController, *, ssh: SshOptions | None = None,
                 expose: bool = False) -> None:
        self.spec = spec
        self.ctl = controller
        self.ssh = ssh
        self.expose = expose

    def measure(self, cfg: ServerConfig, ramp: RampSpec, record: RecordSpec,
                check_abort: Callable[[], None]) -> Measurement:
        s, ctl = self.spec, self.ctl
        t0 = time.monotonic()
        try:
            target = launch_target(s.engine, cfg, sim_args=s.sim_args, python=s.python,
                                   use_nvml=s.engine.spec.card_samples is CardSamples.NVML and not s.hardware.is_cpu
                                   and not s.multi_host,
                                   startup_timeout=s.startup_timeout, grace=s.grace, expose=self.expose,
                                   hosts=s.hosts, ssh=self.ssh, ray_address=s.ray_address)
            try:
                left = ctl.launch(target)
            except (LaunchError, ValueError) as e:
                return Measurement(status="launch_failed", error=str(e))
            if left:
                return Measurement(status="launch_failed", error=(
                    "leftover vLLM processes hold GPU memory: end them (`vllm-dyno cleanup --yes`) and resume the tune"))
            while not ctl.wait_ready(0.5):
                check_abort()
                if ctl.failure is not None:
                    break
            check_abort()
            if not ctl.ready:
                return Measurement(status="launch_failed", error=ctl.failure_text or "the server did not become ready",
                                   rig_seconds=(time.monotonic() - t0) * (ctl.time_scale or 1.0))
            k = ctl.time_scale or 1.0
            start_s = (time.monotonic() - t0) * k
            ctl.start_ramp(ramp.model_copy(update={"url": ctl.url, "model": ctl.api_model}), record=record)
            try:
                check_abort()  # an abort before the start found no ramp to stop
            except BaseException:
                ctl.abort_ramp("the tune was stopped")
                ctl.wait_ramp()
                raise
            out = ctl.wait_ramp()
            assert out is not None
            check_abort()
            rig_s = start_s + sum(st.t_end - st.t_start for st in out.steps)
            if not out.ok or out.capacity is None:
                return Measurement(status=out.status, error=out.stop_reason or out.error or "the search did not finish",
                                   run_id=out.run_id, rig_seconds=rig_s, steps=out.steps)
            return Measurement(status="done", run_id=out.run_id, rig_seconds=rig_s, capacity=out.capacity,
                               steps=out.steps, verdict=out.verdict)
        finally:
            try:
                ctl.stop()
            except Exception:
                log.exception("stopping the tune's server")


class Tuner:
    """Runs one tune (see the module docstring). ``controller``: the run controller to
    launch through (None: one of its own, closed at the end); ``store``: the run store
    (None: the controller's); ``rig``: what measures a configuration (None: a
    :class:`ControllerRig` on the controller, with ``ssh`` and ``expose`` for a rig of
    hosts; benchmarks give the step-level engine of a hidden "true rig"). Call
    :meth:`run` (blocking; off the GUI thread) and :meth:`abort` from anywhere."""

    def __init__(self, spec: TuneSpec, *, controller: RunController | None = None, store: Any = None,
                 listener: TuneListener | None = None, pricing: Pricing | None = None,
                 tune_id: int | None = None, state: TuneState | None = None,
                 clock: Callable[[], float] = time.monotonic, rig: MeasuringRig | None = None,
                 ssh: SshOptions | None = None,
                 expose: bool = False) -> None:
        self.spec = spec
        self._own_ctl = controller is None
        self.ctl = controller or RunController(store=store)
        self.store = store if store is not None and not callable(store) else self.ctl.store
        self.rig: MeasuringRig = rig or ControllerRig(spec, self.ctl, ssh=ssh, expose=expose)
        self.listener = listener or TuneListener()
        self.pricing = pricing
        self.state = state or TuneState()
        self.tune_id = tune_id
        self._clock = clock
        self._abort = threading.Event()
        self._cands: dict[str, Candidate] = {}
        self._t0 = clock()
        self._wall_before = self.state.wall_seconds
        self.workload = spec.workload()
        self.cards = spec.hardware.planner_cards()
        self.board_w = float(self.cards[0].tdp_w or 300.0) if self.cards else 300.0

    # ------------------------------------------------------------------ public
    @classmethod
    def resume(cls, store: Any, tune_id: int, **kw: Any) -> "Tuner":
        """The tuner of a stored tune, to :meth:`run` again from where it stopped.
        Raises ValueError naming the id when there is no such tune or it is finished."""
        row = store.get_tune(tune_id)
        if row is None:
            raise ValueError(f"no tune {tune_id} in {store.path}: see `vllm-dyno tune --list`")
        if row["status"] == "done":
            raise ValueError(f"tune {tune_id} is finished; its result: `vllm-dyno tune --show {tune_id}`")
        spec = TuneSpec.model_validate(row["spec"])
        state = TuneState.model_validate(row["state"] or {})
        return cls(spec, store=store, tune_id=tune_id, state=state, **kw)

    def abort(self) -> None:
        """Stop the tune: the running ramp is aborted and the server stopped; :meth:`run`
        raises :class:`TuneAborted` after saving the state as interrupted."""
        self._abort.set()
        try:
            self.ctl.abort_ramp("the tune was stopped")
        except Exception:  # no ramp running
            pass
        self.ctl.stop_waiting()

    def dry_run(self) -> dict[str, Any]:
        """The space, the planner's pruning and the predictions, without a launch or a
        stored tune: :meth:`result` of that state."""
        self._prepare()
        return self.result()

    def run(self) -> TuneState:
        """Run (or continue) the tune to its end; returns the final state. Raises
        :class:`TuneAborted` when stopped (state saved, status ``interrupted``) and
        ValueError for a space with nothing to launch."""
        if self.tune_id is None:
            self.tune_id = self.store.create_tune(self.spec.name or self._default_name(),
                                                  self.spec.model_dump(mode="json"))
        else:
            self.store.save_tune(self.tune_id, status="running")
        try:
            self._prepare()
            if self.state.phase == "measure":
                self._measure_loop()
                self.state.phase = "confirm"
                self._save("measured: confirming the best")
            if self.state.phase == "confirm":
                self._confirm()
                self.state.phase = "done"
            self._finish()
            self._save("done", status="done")
            return self.state
        except TuneAborted:
            self._save("stopped: resume with `vllm-dyno tune --resume %d`" % self.tune_id, status="interrupted")
            raise
        except BaseException:
            self._save("interrupted by an error", status="interrupted")
            raise
        finally:
            try:
                self.ctl.stop()
            finally:
                if self._own_ctl:
                    self.ctl.close()

    # ------------------------------------------------------------------ steps
    def _default_name(self) -> str:
        hw = self.spec.hardware
        return f"tune {self.spec.config.model} on {hw.cards_text()}{' (sim)' if self.spec.engine.simulated else ''}"

    def _save(self, message: str, status: str | None = None) -> None:
        self.state.wall_seconds = self._wall_before + (self._clock() - self._t0)
        if self.tune_id is not None:
            self.store.save_tune(self.tune_id, status=status, state=self.state.model_dump(mode="json"))
        try:
            self.listener.on_progress(self.state, message)
        except Exception:
            log.exception("tune listener failed")

    def _check_abort(self) -> None:
        if self._abort.is_set():
            raise TuneAborted("the tune was stopped")

    def _prepare(self) -> None:
        """Enumerate (the planner prunes) and predict; keeps what was measured before."""
        cands = self.spec.candidates(self.workload)
        self._cands = {c.key: c for c in cands}
        old = {c.key: c for c in self.state.candidates}
        merged = []
        for c in cands:
            r = old.get(c.key) or CandidateResult(key=c.key)
            r.checkpoint, r.cards, r.server, r.pruned_because = c.checkpoint, c.cards, server_flags(c.config), c.pruned_because
            merged.append(r)
        self.state.candidates = merged
        if not any(r.pruned_because is None for r in merged):
            reasons = sorted({r.pruned_because or "" for r in merged})
            raise ValueError("no configuration in the search space can start on these cards: " + "; ".join(reasons[:3]))
        self._refit()
        self._repredict(first=not old)
        self._save(f"{sum(r.pruned_because is None for r in merged)} of {len(merged)} configurations can start; "
                   "predicted")

    def _refit(self) -> None:
        sets = []
        for r in self.state.candidates:
            plan = self._cands[r.key].plan if r.key in self._cands else None
            if r.measured and r.levels and plan is not None:
                lv = [MeasuredLevel(**x) for x in r.levels]
                sets.append(rig_model.measured_set(plan, lv, self.workload))
        self.state.factors = rig_model.fit([s for s in sets if s is not None]) if sets else {}

    def _plan_of(self, key: str) -> Plan:
        """The planner's check of candidate ``key``, one that can start (each such has one)."""
        plan = self._cands[key].plan
        if plan is None:
            raise ValueError(f"configuration {key}: the planner refused it, it was not to be predicted")
        return plan

    def _repredict(self, first: bool = False) -> None:
        """Screen every runnable candidate, then the engine's prediction for the
        :data:`app.tuner.model.SCREEN_TOP` best, the best of each family value
        (:data:`app.tuner.model.FAMILY_DIMS`: a layout the screen ranks low is still
        predicted, so it can be measured) and every measured one."""
        f = self.state.factors or None
        live = [r for r in self.state.candidates if r.pruned_because is None]
        for r in live:
            r.screen_users = rig_model.screen(self._plan_of(r.key), f, self.workload)
        order = sorted(live, key=lambda r: -(r.screen_users or 0))
        chosen = {r.key for r in order[:rig_model.SCREEN_TOP]} | {r.key for r in live if r.measured}
        seen: set[tuple[str, str]] = set()
        for r in order:  # and the best screened of every family value: an untried family is predicted too
            fams = [(d, v) for d, v in self._families(r).items() if d in rig_model.FAMILY_DIMS]
            if any(f not in seen for f in fams) and (r.screen_users or 0) > 0:
                chosen.add(r.key)
                seen.update(fams)
        for r in live:
            if r.key not in chosen:
                r.predicted_users = r.predicted_tps = r.predicted_low = r.predicted_high = None
                continue
            self._check_abort()
            pr = rig_model.predict(self._plan_of(r.key), f, self.workload)
            if pr is None:
                continue
            r.predicted_users, r.predicted_tps = pr.users, pr.output_tps
            r.predicted_low, r.predicted_high = pr.users_low, pr.users_high
            if first or r.first_predicted_users is None:
                r.first_predicted_users = pr.users
        self._apply_residual(live)

    def _families(self, r: CandidateResult) -> dict[str, str]:
        return rig_model.families_of(r.server, r.checkpoint, r.key)

    def _apply_residual(self, live: list[CandidateResult]) -> None:
        """Correct every engine prediction by what the measurements imply
        (:func:`app.tuner.model.corrections`): a factor common to every candidate (the
        tail of TTFT under closed-loop load, which the fitted factors leave and which is
        common to one rig and workload — without it the unmeasured were predicted 10–30 %
        above their measured siblings), and one per family value measured (a layout
        measured 30 % below its prediction pulls its untried siblings down with it: the
        ranking follows the measurements, not the re-fitted factors alone); each gets the
        uncertainty of that (``predicted_sd``): the model's residual between the measured
        families (:func:`app.tuner.model.family_spread`) for a family none measured."""
        measured = [(self._families(r), math.log(r.measured_users / r.predicted_users)) for r in live
                    if r.measured and r.measured_users and r.predicted_users]
        self.state.residual = rig_model.residual([(r.measured_users, r.predicted_users) for r in live
                                                  if r.measured and r.measured_users and r.predicted_users])
        tau = rig_model.family_spread([y for _, y in measured])
        self.state.uncertainty = tau
        todo = [r for r in live if r.predicted_users is not None]
        for r, c in zip(todo, rig_model.corrections(measured, [self._families(r) for r in todo], tau)):
            f = math.exp(c.log_mean)
            r.predicted_sd = c.log_sd
            assert r.predicted_users is not None  # chosen above
            r.predicted_users = rig_model.snap_users(r.predicted_users * f)
            for name in ("predicted_low", "predicted_high"):
                v = getattr(r, name)
                if v is not None:
                    setattr(r, name, rig_model.snap_users(v * f))
            if r.predicted_tps is not None:
                r.predicted_tps *= f

    def _score(self, r: CandidateResult, measured: bool) -> float | None:
        if measured:
            return score(self.spec.objective, r.measured_users, r.measured_tps, r.cards, self.board_w,
                         r.j_per_token, self.pricing)
        return score(self.spec.objective, r.predicted_users, r.predicted_tps, r.cards, self.board_w, None,
                     self.pricing)

    def _rank(self, r: CandidateResult) -> tuple:
        """Order of the unmeasured: the predicted score, then (ties within a search's
        resolution are common) the predicted tokens/s, then the KV cache's room — the
        configuration with more headroom for longer requests than the mean."""
        p = self._cands[r.key].plan if r.key in self._cands else None
        kv = p.kv_cache_tokens * p.dp if p is not None and p.ranks else 0
        return (_or_lowest(self._score(r, False)), r.predicted_tps or 0.0, kv)

    def best_measured(self) -> CandidateResult | None:
        """The best measured candidate by the objective's score; among equal scores (a
        search resolves whole users) the surer one — the higher low end of its interval —
        then the one whose latencies cross the SLO further up between its capacity level
        and the first level that broke it (:func:`app.loadgen.capacity.crossing_users`:
        the finer estimate of its capacity), then the higher measured tokens/s."""
        ms = [r for r in self.state.candidates if r.measured and self._score(r, True) is not None]
        return max(ms, key=lambda r: (self._score(r, True), r.measured_low or 0.0, r.measured_crossing or 0.0,
                                      r.measured_tps or 0.0)) if ms else None

    def _margin(self, best: CandidateResult) -> float:
        """How much better (in the objective's score) a prediction must be than ``best``'s
        measurement to be worth a launch: the measurement's spread — half its interval,
        at least the search's resolution (a user, or ``resolution`` × users)."""
        users = best.measured_users or 0.0
        half = ((best.measured_high or users) - (best.measured_low or users)) / 2
        step = max(1.0, self.spec.resolution * users)
        rel = max(half, step) / max(users, 1.0)
        sc = self._score(best, True) or 0.0
        return abs(sc) * rel

    def _optimistic(self, r: CandidateResult) -> float | None:
        """An unmeasured candidate's score at :data:`app.tuner.model.Z` sd above its
        corrected prediction (users and tokens/s × e^(Z·sd)): what it could plausibly serve."""
        u = math.exp(rig_model.Z * (r.predicted_sd or 0.0))
        users = r.predicted_users * u if r.predicted_users is not None else None
        tps = r.predicted_tps * u if r.predicted_tps is not None else None
        return score(self.spec.objective, users, tps, r.cards, self.board_w, None, self.pricing)

    def _tried_families(self) -> set[tuple[str, str]]:
        """The family values (:data:`app.tuner.model.FAMILY_DIMS`) of the candidates launched so far."""
        return rig_model.tried_families([self._families(r) for r in self.state.candidates
                                         if r.measured or r.failed is not None])

    def _next(self) -> tuple[CandidateResult | None, str]:
        """The candidate to launch next, or None and why the search stops (issue 35 item 2).

        The first launch: the best predicted. Then every unmeasured candidate is judged by
        its optimistic score (:meth:`_optimistic`: its prediction corrected by the
        measurements, + Z sd of the model's residual for the families not measured); one
        is worth a launch while that beats the best measured by more than its spread
        (:meth:`_margin`). Of those, a candidate of a family value not launched yet (a
        layout, a quantization, a KV-cache dtype, CUDA graphs on/off) goes first — the
        best of each untried family before refining within one — the best by its
        corrected prediction (:func:`app.tuner.model.pick_next`). The search stops on evidence: when no bound
        beats the best measured."""
        todo = [r for r in self.state.candidates if r.pruned_because is None and not r.measured and r.failed is None
                and self._score(r, False) is not None]
        if not todo:
            return None, "every candidate predicted to serve users at the SLO was measured"
        best = self.best_measured()
        if best is None:
            return max(todo, key=self._rank), ""
        have = self._score(best, True)
        if have is None:  # (chosen for having a score)
            return max(todo, key=self._rank), ""
        need = have + self._margin(best)
        by_key = {r.key: r for r in todo}
        pick = rig_model.pick_next([rig_model.Option(r.key, self._families(r), self._optimistic(r), self._rank(r))
                                    for r in todo], self._tried_families(), need)
        if pick is None:
            return None, (f"converged on evidence: no candidate could beat the best measured ({best.key}: "
                          f"{best.measured_users:g} users) by more than its spread, even "
                          f"{rig_model.Z:g} sd of the model's residual above its corrected prediction")
        return by_key[pick.key], ""

    def _budget_left(self, reserve: int) -> str | None:
        s = self.spec
        used = len(self.state.launches)
        if used >= s.max_launches - reserve:
            return f"budget: {s.max_launches} launch{'es' if s.max_launches != 1 else ''}"
        if s.max_minutes is not None and (self._wall_before + self._clock() - self._t0) >= s.max_minutes * 60:
            return f"budget: {s.max_minutes:g} minutes"
        return None

    def _measure_loop(self) -> None:
        reserve = 1 if self.spec.max_launches >= 2 else 0
        # a launch cut off by an interruption is run again
        self.state.launches = [x for x in self.state.launches if x.status != "running"]
        while True:
            self._check_abort()
            if self.state.safety_stop:
                self.state.stop_reason = self.state.safety_stop
                return
            over = self._budget_left(reserve)
            if over:
                self.state.stop_reason = over
                return
            pick, why = self._next()
            if pick is None:
                self.state.stop_reason = why
                return
            self._measure(pick)
            self._refit()
            self._repredict()
            best = self.best_measured()
            self._save(f"refit on {sum(r.measured for r in self.state.candidates)} measured; best so far: "
                       f"{best.key if best else 'none'}")

    # ------------------------------------------------------------------ launches
    def _launch_and_search(self, cfg: ServerConfig, key: str, purpose: Literal["measure", "confirm"], start: float
                           ) -> tuple[LaunchRecord, Measurement]:
        """Launch ``cfg`` on the rig, run the capacity search from ``start`` users, stop.
        Never raises for a failed launch: the record says why."""
        s = self.spec
        rec = LaunchRecord(n=len(self.state.launches) + 1, key=key, purpose=purpose)
        self.state.launches.append(rec)
        self._save(f"launch {rec.n} of ≤ {s.max_launches}: {key} ({purpose})")
        spec = launch_search(s, self.workload, start)
        plan = self._cands[key].plan if key in self._cands else None
        name = f"tune {self.tune_id} · {purpose} {rec.n}: {key}"
        t0 = self._clock()
        m = self.rig.measure(cfg, spec, RecordSpec(name=name, plan=plan.as_dict() if plan is not None else None),
                             self._check_abort)
        rec.wall_seconds = self._clock() - t0
        rec.run_id, rec.rig_seconds, rec.status, rec.error = m.run_id, m.rig_seconds, m.status, m.error
        if m.status == "safety":  # the controller's thermal stop: no further launch heats the cards again
            self.state.safety_stop = self.state.stop_reason = m.error or "safety stop"
        if m.capacity is not None and m.status == "done":
            cap = m.capacity
            rec.users, rec.users_low, rec.users_high, rec.output_tps = cap.users, cap.users_low, cap.users_high, cap.output_tps
            rec.sentence = m.verdict.sentence if m.verdict is not None else cap.sentence
            rec.verdict = m.verdict.model_dump(mode="json") if m.verdict is not None else None
        return rec, m

    def _measure(self, r: CandidateResult) -> None:
        cand = self._cands[r.key]
        rec, out = self._launch_and_search(cand.config, r.key, "measure", r.predicted_users or 1.0)
        r.run_id = rec.run_id
        if rec.status != "done" or out.capacity is None:
            r.failed = rec.error or rec.status
            self._save(f"{r.key}: {r.failed}")
            return
        cap = out.capacity
        r.measured_users, r.measured_low, r.measured_high, r.measured_tps = (cap.users, cap.users_low,
                                                                             cap.users_high, cap.output_tps)
        r.measured_crossing = crossing_users(cap)
        r.j_per_token = out.verdict.j_per_token if out.verdict is not None else None
        r.levels = [asdict(MeasuredLevel(int(st.level), st.output_tps, st.ttft_mean, st.tpot_mean))
                    for st in out.steps if st.n_ok > 0 and st.output_tps > 0]
        self._save(f"{r.key}: measured {cap.users:g} users ({cap.users_low:g}–{cap.users_high:g}), "
                   f"predicted {r.predicted_users if r.predicted_users is not None else '—'}")

    def _confirm(self) -> None:
        """The confirming launch of the best measured candidate with its max_num_seqs."""
        best = self.best_measured()
        if best is None:
            self.state.recommendation = None
            if not self.state.stop_reason:
                self.state.stop_reason = "no candidate met the SLO"
            return
        if any(x.purpose == "confirm" and x.status != "running" for x in self.state.launches):
            return  # confirmed before an interruption
        self.state.launches = [x for x in self.state.launches if x.status != "running"]
        cfg = self._recommended_config(best)
        if len(self.state.launches) >= self.spec.max_launches:
            return  # no launch left: the recommendation stays unconfirmed
        if self.state.safety_stop:
            return  # stopped for safety: the recommendation stays unconfirmed
        self._check_abort()
        self._launch_and_search(cfg, best.key, "confirm", best.measured_users or 1.0)

    def _recommended_config(self, best: CandidateResult) -> ServerConfig:
        """The best measured candidate with ``max_num_seqs`` from its capacity: per engine
        (a data parallel replica runs its share of the users, ``max_num_seqs`` each)."""
        cfg = self._cands[best.key].config
        dp = cfg.data_parallel_size or 1
        seqs = recommended_max_num_seqs((best.measured_users or 1.0) / dp, cfg.max_num_seqs)
        return cfg.model_copy(update={"max_num_seqs": seqs})

    # ------------------------------------------------------------------ result
    def _tried(self, best: CandidateResult, fix: dict[str, Any]) -> Tried | None:
        """What the tune knows of ``best``'s configuration with ``fix`` (a verdict's next
        step): the candidates that have the fix's values and otherwise differ from
        ``best`` at most in ``max_num_seqs`` and the data-parallel count (the cards are
        the same), the best of them by the objective; None when no candidate is one."""
        base = self._cands[best.key].config.model_dump()
        loose = set(fix) | {"max_num_seqs", "data_parallel_size"}
        like = []
        for r in self.state.candidates:
            c = self._cands.get(r.key)
            if c is None or r.key == best.key:
                continue
            cfg = c.config.model_dump()
            if all(cfg.get(k) == v for k, v in fix.items()) and all(
                    cfg.get(k) == v for k, v in base.items() if k not in loose):
                like.append(r)
        if not like:
            return None
        have = self._score(best, True)

        def known(r: CandidateResult) -> float:
            sc = self._score(r, r.measured)
            return -math.inf if sc is None or r.pruned_because or r.failed else sc
        r = max(like, key=known)
        if r.pruned_because or r.failed:
            return Tried(None, r.failed is not None, True, r.pruned_because or r.failed or "")
        sc = known(r)
        users = r.measured_users if r.measured else r.predicted_users
        return Tried(users if users else None, r.measured, have is not None and sc <= have,
                     "" if users else "no users at the SLO predicted")

    def _launch_sentence(self, launch: LaunchRecord | None, best: CandidateResult, default: str) -> str:
        """A launch's verdict sentence with its next step held against the tune
        (:func:`app.run.verdict.against_tune`); ``default`` without a launch."""
        if launch is None:
            return default
        if launch.verdict is None:
            return launch.sentence or default
        v = Verdict.model_validate(launch.verdict)
        if v.next_fix is None:
            return launch.sentence or v.sentence
        return against_tune(v, self._tried(best, v.next_fix)).sentence

    def _entry(self, r: CandidateResult, cfg: ServerConfig | None = None, measured: bool = True) -> dict[str, Any]:
        cfg = cfg or self._cands[r.key].config
        return {"key": r.key, "server": server_flags(cfg),
                # the whole configuration as launched (extra options, env, cards): Save as profile
                "config": cfg.model_dump(mode="json", exclude_none=True),
                "users": r.measured_users if measured else r.predicted_users,
                "users_low": r.measured_low if measured else r.predicted_low,
                "users_high": r.measured_high if measured else r.predicted_high,
                "output_tps": r.measured_tps if measured else r.predicted_tps,
                "j_per_token": r.j_per_token if measured else None,
                "measured": measured, "predicted_users": r.predicted_users, "run_id": r.run_id}

    def _finish(self) -> None:
        st = self.state
        best = self.best_measured()
        if best is not None:
            cfg = self._recommended_config(best)
            explored = self._cands[best.key].config
            rec = self._entry(best, cfg)
            measured = next((x for x in st.launches if x.key == best.key and x.purpose == "measure"
                             and x.status == "done"), None)
            conf = next((x for x in st.launches if x.purpose == "confirm"), None)
            floor = (best.measured_users or 0) * (1 - self.spec.resolution) - 1.0
            seqs, seqs_was = cfg.max_num_seqs, explored.max_num_seqs
            if conf is not None and conf.status == "done" and conf.users is not None and conf.users >= floor:
                rec.update(users=conf.users, users_low=conf.users_low, users_high=conf.users_high,
                           output_tps=conf.output_tps, run_id=conf.run_id,
                           sentence=self._launch_sentence(conf, best, conf.sentence), verified=True)
            elif conf is not None and conf.status == "done" and conf.users is not None:
                # max_num_seqs from the capacity served fewer users: keep the flags as measured
                rec = self._entry(best, explored)
                rec.update(verified=True, sentence=self._launch_sentence(measured, best, "") + (
                    f" (with max_num_seqs {seqs} instead of {seqs_was} the confirming launch measured "
                    f"{conf.users:g} users ({_fmt_iv(conf.users_low, conf.users_high)}): max_num_seqs stays {seqs_was})"))
            else:
                why = (f"the confirming launch failed: {conf.error}" if conf is not None
                       else (f"the tune stopped: {st.safety_stop}" if st.safety_stop
                             else "no launch was left to confirm it"))
                rec.update(verified=False, sentence=self._launch_sentence(measured, best, best.key) + (
                    f" — measured with max_num_seqs {seqs_was}; max_num_seqs {seqs} is not confirmed: {why}"))
            st.recommendation = rec
            others = [r for r in st.candidates if r.measured and r.key != best.key]
            if others:
                ru = max(others, key=lambda r: self._score(r, True) or -math.inf)
                st.runner_up = self._entry(ru)
            else:
                rest = [r for r in st.candidates if r.pruned_because is None and r.key != best.key
                        and self._score(r, False) is not None]
                st.runner_up = (self._entry(max(rest, key=lambda r: _or_lowest(self._score(r, False))), measured=False)
                                if rest else None)
        st.baseline = self._baseline()

    def _baseline(self) -> dict[str, Any] | None:
        """The user's starting flags, predicted with the fitted factors (measured when
        one of the candidates is exactly them)."""
        s = self.spec
        try:
            p = check(s.config, self.cards[:s.config.world_size], resolve_model(s.config.model), self.workload,
                      s.vllm_version, rig=s.hardware.rig_layout())
            pr = rig_model.predict(p, self.state.factors or None, self.workload)
        except (ValueError, LookupError) as e:
            return {"server": server_flags(s.config), "measured": False, "users": None, "error": str(e)}
        same = next((r for r in self.state.candidates if r.measured and r.server == server_flags(s.config)), None)
        if same is not None:
            return self._entry(same, s.config)
        errors = [f"{f.problem}: {f.message}" for f in p.findings if f.verdict == "error"]
        refused = rig_refusal(s.config, s.hosts, s.ray_address)  # over hosts: their launch plan's word
        if refused is not None:
            errors.insert(0, refused)
        if errors:
            return {"key": "starting flags", "server": server_flags(s.config), "measured": False, "users": None,
                    "error": "cannot start: " + errors[0]}
        if pr is not None and self.state.residual != 1.0:
            pr = rig_model.Prediction(rig_model.snap_users(pr.users * self.state.residual),
                                      pr.output_tps * self.state.residual if pr.output_tps else None,
                                      None, None, True)
        return {"key": "starting flags", "server": server_flags(s.config), "measured": False,
                "users": pr.users if pr else None, "users_low": pr.users_low if pr else None,
                "users_high": pr.users_high if pr else None, "output_tps": pr.output_tps if pr else None}

    def result(self, state: TuneState | None = None) -> dict[str, Any]:
        """The JSON of ``vllm-dyno tune --json``: ``recommendation`` (``server``, ``users``,
        ``output_tps``, ``sentence``, ``verified`` …), ``runner_up``, ``baseline``,
        ``launches`` (count) with ``launch_log``, ``rig_seconds``, ``wall_seconds``,
        ``safety_stop`` (the controller's sentence when a thermal stop ended it, else null),
        ``candidates`` (``server``, ``predicted_users``, ``measured_users`` or null,
        ``pruned_because`` or null; ``predicted_tps``/``measured_tps`` output tok/s,
        ``levels``: the measured levels as :class:`app.planner.calibrate.MeasuredLevel`
        fields), ``factors``, ``stop_reason``, ``phase`` (measure → confirm → done).
        ``state``: a snapshot of the state to report instead of the live one."""
        st = state or self.state
        return {
            "tune_id": self.tune_id, "objective": self.spec.objective,
            "slo": self.spec.slo.model_dump(exclude_none=True),
            "recommendation": st.recommendation, "runner_up": st.runner_up, "baseline": st.baseline,
            "launches": len(st.launches), "launch_log": [x.model_dump() for x in st.launches],
            "rig_seconds": st.rig_seconds, "wall_seconds": st.wall_seconds, "stop_reason": st.stop_reason,
            "safety_stop": st.safety_stop,
            "factors": st.factors, "residual": st.residual, "phase": st.phase,
            "candidates": [{"key": r.key, "server": r.server, "cards": r.cards, "checkpoint": r.checkpoint,
                            "screen_users": r.screen_users,
                            "first_predicted_users": r.first_predicted_users, "predicted_users": r.predicted_users,
                            "predicted_tps": r.predicted_tps,
                            "measured_users": r.measured_users if r.measured else None,
                            "measured_low": r.measured_low if r.measured else None,
                            "measured_high": r.measured_high if r.measured else None,
                            "measured_tps": r.measured_tps if r.measured else None,
                            "j_per_token": r.j_per_token if r.measured else None,
                            "levels": list(r.levels) if r.measured else [],
                            "failed": r.failed, "pruned_because": r.pruned_because, "run_id": r.run_id}
                           for r in st.candidates],
            "model_error": self.model_error(st),
            "confidence": self.confidence(st),
        }

    def confidence(self, state: TuneState | None = None) -> dict[str, Any]:
        """How sure the tune is (issue 35 item 2): ``families`` — for each of
        :data:`app.tuner.model.FAMILY_DIMS`, the values ``measured`` and those ``untried``
        with ``why`` (the planner pruned every candidate of it; none is predicted to serve
        the SLO; even its best optimistic bound does not beat the best measured; the
        budget ended first); ``residual`` the model's error between the measured families
        (a log sd, :func:`app.tuner.model.family_spread`; ``residual_pct`` as a per cent
        factor), ``common_factor`` measured ÷ predicted users over every measured one."""
        st = state or self.state
        best = next((r for r in st.candidates if st.recommendation and r.key == st.recommendation.get("key")), None)
        have = self._score(best, True) if best is not None else None
        need = have + self._margin(best) if best is not None and have is not None else None
        tau = st.uncertainty if st.uncertainty is not None else rig_model.TAU_PRIOR
        fams: dict[str, dict[str, Any]] = {}
        for d in rig_model.FAMILY_DIMS:
            values: dict[str, list[CandidateResult]] = {}
            for r in st.candidates:
                values.setdefault(self._families(r)[d], []).append(r)
            measured = sorted(v for v, rs in values.items() if any(r.measured for r in rs))
            untried = []
            for v, rs in sorted(values.items()):
                if v in measured:
                    continue
                live = [r for r in rs if r.pruned_because is None]
                scored = [r for r in live if self._score(r, False) is not None and r.failed is None]
                if not live:
                    why = f"the planner: {rs[0].pruned_because}"
                elif any(r.failed for r in live) and not scored:
                    why = f"its launch failed: {next(r.failed for r in live if r.failed)}"
                elif not scored:
                    why = "predicted to serve no users at the SLO (or not predicted: ranked low by the screen)"
                else:
                    top = max(scored, key=lambda r: _or_lowest(self._optimistic(r)))
                    bound = self._optimistic(top)
                    if need is not None and bound is not None and bound <= need:
                        why = (f"at best {top.predicted_users:g} users predicted ({top.key}), below the best "
                               f"measured even {rig_model.Z:g} sd above")
                    elif best is None:
                        why = "nothing was measured"
                    else:
                        why = f"the budget ended first (best predicted {top.predicted_users:g} users: {top.key})"
                untried.append({"value": v, "why": why})
            if len(values) > 1 or untried:
                fams[d] = {"measured": measured, "untried": untried}
        return {"families": fams, "residual": tau, "residual_pct": round((math.exp(tau) - 1) * 100, 1),
                "common_factor": st.residual,
                "measured": sum(r.measured for r in st.candidates),
                "startable": sum(r.pruned_because is None for r in st.candidates)}

    def model_error(self, state: TuneState | None = None) -> dict[str, Any] | None:
        """How far the model behind the tune's predictions (the unmeasured candidates, the
        starting flags) is from published GPU runs before it is fitted to this rig's
        launches, for the recommended (else the best predicted) candidate's cards, load,
        layout and quantization (:func:`app.planner.model_error.statement`, its
        ``as_dict``); None on the CPU build or without a candidate."""
        st = state or self.state
        entry = st.recommendation
        if entry is None:
            ranked = [r for r in st.candidates if r.pruned_because is None and r.predicted_users]
            if not ranked:
                return None
            best = max(ranked, key=lambda r: r.predicted_users or 0.0)
            entry = {"server": best.server, "users": best.predicted_users}
        gpu = self.spec.hardware.gpu
        if card_class(gpu) == CPU_CLASS:
            return None
        srv = entry.get("server") or {}
        dp = int(srv.get("data_parallel_size") or 1)
        world = int(srv.get("tensor_parallel_size") or 1) * int(srv.get("pipeline_parallel_size") or 1) * dp
        try:
            quant = srv.get("quantization") or resolve_model(srv.get("model") or self.spec.config.model).quant_method
            return error_statement(gpu, float(entry.get("users") or 1.0) / dp, world, quant).as_dict()
        except (FileNotFoundError, LookupError, ValueError):
            return None
