"""The run controller: the only code that sequences a run.

launch (or attach) → ready → telemetry → one or more ramps → record → stop, for every
engine (``vllm``, ``sim``, ``attach``). ``vllm-dyno run`` (:mod:`app.run.profile_run`),
``vllm-dyno ramp`` (attach mode) and the GUI (``widgets.run_adapter``, an adapter turning
the callbacks below into Qt signals) all drive it; the tuner will too. It owns:

- the server (:class:`app.server.supervisor.Supervisor`) and the leftover check — or,
  for a profile whose ``hosts:`` name two or more machines, a rig of them (issue 21,
  :meth:`RunController._launch_rig`): every host's agent (:class:`app.hosts.rig.Rig`),
  the layout's checks and launch plan (:mod:`app.hosts.checks`, :mod:`app.hosts.plan`),
  each host's part started through its agent, the head's API server as the URL, every
  host's telemetry on the session clock; a host lost (its agent's channel closed, or its
  server part ended) is a server failure naming the host, and the other hosts' parts
  are ended at once;
- telemetry (NVML, the sim rig's HTTP source, host, ``/metrics``) into one
  :class:`~app.telemetry.series.SeriesBank` (``bank``) and the client-side live series
  (``client``, :class:`app.loadgen.live.ClientSeries`);
- the sim's time scale k (asked once from ``/sim/info`` when the server is ready) and
  every conversion to rig seconds: ramp specs are written in rig seconds and run
  ÷ k; level stats, the knee and the stop reason come back × k (docs/design.md,
  "Sim time");
- safety stops from Settings (thermal margin, failure rate: :mod:`app.run.safety`), on
  every ramp unless its caller opts out with ``NO_SAFETY``;
- the diagnosis of a failed launch, and of a server whose engine died after it was
  ready (one place: :func:`app.planner.diagnose.diagnose`, structured: code, evidence
  lines, fix, ``after_ready``). A ramp that ends badly asks whether the server died
  (:meth:`RunController._server_died`): a launched server's exit or 5xx ``/health``
  waits for the supervisor's verdict; an attached one is probed (its log is not ours);
- recording: it is the only writer to the run store during a run
  (:class:`app.run.record.RunRecorder`): level rows are written once, in rig seconds;
- J/token of a level (:meth:`RunController.energy`, the one definition in
  :func:`app.telemetry.derived.level_energy`).

Subscribers: a :class:`RunListener` whose methods are called on the controller's worker
threads (supervisor, load-generator reader, ramp thread) — never block in them.
Blocking methods (:meth:`launch`, :meth:`stop`, :meth:`ramp`) must not be called on a
GUI thread; :meth:`start_ramp` and :meth:`abort_ramp` return at once.
"""
from __future__ import annotations

import asyncio
import functools
import gc
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from app.clock import SessionClock
from app.config import ServerConfig, exposure_problem
from app.engines import CardSamples, Engine
from app.hosts.checks import rig_findings, socket_interfaces
from app.hosts.link import HostError, SshOptions
from app.hosts.plan import RAY_STARTED, HostCommand, PlanError, launch_plan
from app.hosts.rig import Rig
from app.hosts.spec import Host
from app.loadgen.generator import LoadGenerator, RampResult
from app.loadgen.live import ClientSeries
from app.loadgen.prompts import dataset_lengths
from app.loadgen.server_stats import with_notes
from app.loadgen.spec import RampSpec, spec_to_wall
from app.loadgen.capacity import Capacity, capacity_of
from app.loadgen.spec import CapacitySearch
from app.loadgen.stats import Knee, StepStats, find_knee, records_to_rig, rig_stop_reason, to_rig_time
from app.planner.diagnose import Diagnosis, diagnose
from app.profiles.model import HardwareFingerprint, Profile, ResultsSummary
from app.run.hardware import hardware_for, rig_hardware, sim_info, time_scale_of
from app.planner.launch_defaults import LaunchDefaults, cpu_build_defaults
from app.run.launch_timing import HISTORY, LaunchProgress, expected_phases, launch_key, progress
from app.run.record import RunRecorder
from app.run.events import RunListener, State
from app.run.safety import CHECK_INTERVAL_S, NoSafety, apply_safety, resolve_safety, thermal_stop_reason
from app.run.verdict import Verdict, build_verdict, model_label, observe
from app.settings import SafetyLimits, load_settings
from app.server import procs
from app.server.interpreter import inspect_interpreter, resolve_python
from app.server.launch import LaunchError
from app.server.supervisor import StateChange, Supervisor, health_status
from app.store import RunStore
from app.telemetry import names
from app.telemetry.derived import LevelEnergy, gpu_series, level_energy
from app.telemetry.gpu_source import GpuSource
from app.telemetry.http_source import HttpGpuSource
from app.telemetry.hub import Telemetry
from app.telemetry.nvml_source import NvmlSource
from app.telemetry.series import SeriesBank

log = logging.getLogger(__name__)


#: states in which a server is up (or coming up) under this controller
RUNNING_STATES = (State.STARTING, State.LOADING, State.READY, State.STOPPING, State.ATTACHED)

#: statuses of a ramp that ran to an orderly end
OK_STATUSES = ("done", "slo_broken", "stopped")

#: seconds between tries to save a finished run the store refused (a full disk)
SAVE_RETRY_S = 5.0


def _part_key(cmd: HostCommand) -> str:
    """A part's key in :attr:`RunController.rig_parts`: its host's label (``"H ray"`` for
    the host's Ray node)."""
    return cmd.host.label() + (" ray" if cmd.part == "ray" else "")


@dataclass
class LaunchTarget:
    """What to start. ``engine``: an :class:`app.engines.Engine` — ``vllm``, ``sim`` or
    ``attach`` (a name is taken as its engine). ``sim_args``: the sim rig's options
    (``--sim-gpu …``, ``SimRig.argv()``). ``python``: the vLLM interpreter (None →
    app.server.interpreter.resolve_python). ``attach_url``/``attach_model``: the server to
    attach to. ``use_nvml``: sample this machine's cards (not for the sim, nor the CPU
    build). Intervals in seconds between samples; ``startup_timeout`` and ``grace``
    (SIGTERM → SIGKILL) in seconds, ``grace`` None = the engine's
    (``Engine.spec.stop_grace_s``: 10 s for the sim, 20 s for vLLM). ``expose``: the user
    confirmed a ``config.host`` beyond loopback (``--expose``, the window's dialog);
    without it such a launch is refused (issue 15, item 4).
    ``fill_defaults``: the CPU build's working defaults are still to be filled in for
    what the user did not set (:meth:`RunController.launch_defaults`; False once done; a
    rig's are filled in by each host's agent for its own interpreter and cores).
    ``hosts``: the profile's rig (two or more: a multi-host launch through the hosts'
    agents, :meth:`RunController._launch_rig`); ``ssh``: how they are reached (None: the
    user's SSH agent, config and known hosts); ``rig_timeout``: seconds to open every
    host's agent and probe it, and for the Ray backend's cluster to come up;
    ``ray_address``: a running Ray cluster (``HOST:PORT``) the Ray backend attaches to
    instead of starting one on the hosts (the profile's ``ray_address``)."""

    engine: Engine
    config: ServerConfig
    sim_args: list[str] = field(default_factory=list)
    python: str | None = None
    attach_url: str | None = None
    attach_model: str | None = None
    use_nvml: bool = True
    telemetry: bool = True
    gpu_interval: float = 0.25
    metrics_interval: float = 0.5
    startup_timeout: float = 900.0
    grace: float | None = None
    expose: bool = False
    fill_defaults: bool = True
    hosts: list[Host] = field(default_factory=list)
    ssh: SshOptions | None = None
    rig_timeout: float = 180.0
    ray_address: str | None = None

    def __post_init__(self) -> None:
        self.engine = Engine(self.engine)

    @property
    def multi_host(self) -> bool:
        """A launch over two or more hosts (their agents), not one local server."""
        return self.engine.launches and len(self.hosts) >= 2

    @classmethod
    def from_profile(cls, profile: Profile, **kw: Any) -> "LaunchTarget":
        """The target of a profile: its engine, server config, sim rig or attach URL;
        ``kw`` sets the other fields."""
        cfg = profile.server_config()
        sim = profile.sim.argv() if profile.engine.simulated and profile.sim else []
        # attached: the served model is the first one /v1/models lists (the load generator asks)
        kw.setdefault("hosts", list(profile.hosts))
        kw.setdefault("ray_address", profile.ray_address)
        return cls(engine=profile.engine, config=cfg, sim_args=sim, attach_url=profile.attach_url, **kw)


@dataclass
class RecordSpec:
    """How a run is recorded: the ``profile`` snapshot (None for ``vllm-dyno ramp``),
    the planner's ``plan.as_dict()`` and the run's ``name`` (default: the profile's)."""

    profile: Profile | None = None
    plan: dict | None = None
    name: str | None = None


@dataclass
class RampOutcome:
    """What a ramp produced, in rig seconds.

    ``status``: ``done``, ``slo_broken``, ``failed`` (failure-rate stop), ``stopped``
    (total-duration cap), ``safety`` (thermal stop), ``aborted``, ``server_failed`` or
    ``error`` (nothing ran: ``error`` holds the message). ``stop_reason``: one line for
    humans. ``run_id``: the recorded run (None when not recorded, or not saved yet).
    ``unsaved``: why the run is not (completely) in the run store yet — a full disk, a
    read-only home: the path and the cause; the controller saves it when it can
    (:meth:`RunController.save_pending`). ``records``: every
    request (session-clock seconds, wall). ``capacity``: users at the SLO from the levels
    (a capacity search's answer, or the ramp's levels judged the same way);
    ``verdict``: the one-sentence answer with the rig, flags, cost and limit."""

    status: str
    stop_reason: str = ""
    error: str | None = None
    model: str | None = None
    steps: list[StepStats] = field(default_factory=list)
    knee: Knee | None = None
    run_id: int | None = None
    results: ResultsSummary | None = None
    summary: dict[str, Any] | None = None
    records: list = field(default_factory=list)
    time_scale: float = 1.0
    capacity: Capacity | None = None
    verdict: Verdict | None = None
    unsaved: str | None = None

    @property
    def ok(self) -> bool:
        """True when the ramp ran to an orderly end (all levels, an SLO stop or its cap)."""
        return self.status in OK_STATUSES


class _Ramp:
    """A running ramp."""

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


class RunController:
    """One session: a server (launched or attached) and the ramps run against it.

    ``store``: a :class:`app.store.RunStore`, a zero-argument callable returning one
    (opened on first use, off the GUI thread), or None (the default run store, opened
    on first use and closed by :meth:`close`). ``listener``: a :class:`RunListener`.
    ``clock``: the session clock shared by every sample, request and log line.
    """

    def __init__(self, *, store: Any = None, listener: RunListener | None = None,
                 clock: SessionClock | None = None) -> None:
        self._store_src = store
        self._store = None if (store is None or callable(store)) else store
        self._own_store = store is None
        self.listener = listener or RunListener()
        self.clock = clock or SessionClock()
        self.bank = SeriesBank()
        self.client = ClientSeries()
        self.state = State.IDLE
        self.target: LaunchTarget | None = None
        self.supervisor: Supervisor | None = None
        self.last_supervisor: Supervisor | None = None  # the stopped one, for its log and leftovers
        self.telemetry: Telemetry | None = None
        self.url: str | None = None
        self.api_model: str | None = None
        self.sim_info: dict[str, Any] = {}
        self.time_scale = 1.0
        self.hardware: HardwareFingerprint | None = None  # the cards of the recorded run (None: unknown)
        self.failure: tuple[str, Diagnosis | None] | None = None
        self._failed = threading.Event()  # set with self.failure
        self.run: RunRecorder | None = None  # a run opened by open_run (spans the launch)
        self._ramp: _Ramp | None = None
        self._lock = threading.RLock()
        self._ready = threading.Event()
        self._bg: list[threading.Thread] = []
        #: finished runs the store could not take yet (a full disk): retried every SAVE_RETRY_S
        self.unsaved: list[RunRecorder] = []
        self._outcomes: dict[int, RampOutcome] = {}  # id(recorder) → the outcome that reported it unsaved
        self._saver: threading.Thread | None = None
        self._closing = threading.Event()
        #: the launch's configuration key and the earlier launches' phase starts
        #: (:mod:`app.run.launch_timing`; None: no earlier launch of it)
        self.launch_key: str | None = None
        self.launch_expected: dict[str, float] | None = None
        self._phase_seen: str | None = None
        #: a multi-host launch: the hosts' agents, the plan launched, the head's host
        self.rig: Rig | None = None
        self.rig_plan: list[HostCommand] = []
        self.rig_parts: dict[str, dict[str, Any]] = {}  # host (``"H ray"``: its Ray node) → its agent's ``launched`` reply
        self._rig_probes: list[dict[str, Any]] = []  # each host's probe, in the hosts' order
        self._rig_last: list[dict[str, Any]] = []  # rig_status() as the rig was closed
        self._rig_stopping = False
        self._rig_grace = 20.0  # s, SIGTERM → SIGKILL of each host's part

    # ------------------------------------------------------------------ store
    @property
    def store(self) -> RunStore:
        """The run store (opened on first use)."""
        with self._lock:
            if self._store is None:
                if callable(self._store_src):
                    self._store = self._store_src()
                else:
                    self._store = RunStore()  # opened lazily: the GUI starts without a database
            return self._store

    def close(self) -> list[int]:
        """:meth:`stop`, then close the run store if this controller opened it."""
        left = self.stop()
        self._closing.set()
        if self.unsaved:
            self.save_pending()
        if self._own_store and self._store is not None:
            self._store.close()
            self._store = None
        return left

    # ------------------------------------------------------------------ runs not saved yet
    def _keep_unsaved(self, rec: RunRecorder, outcome: "RampOutcome | None" = None) -> str:
        """A finished run the store refused (part of): kept, retried in the background
        (``outcome``'s ``run_id`` is set and ``unsaved`` cleared once it is saved);
        returns the message for the user (the path, the cause, what happens next)."""
        with self._lock:
            if rec not in self.unsaved:
                self.unsaved.append(rec)
            if outcome is not None:
                self._outcomes[id(rec)] = outcome
            if not self._closing.is_set() and (self._saver is None or not self._saver.is_alive()):
                self._saver = threading.Thread(target=self._save_loop, name="run-saver", daemon=True)
                self._saver.start()
        return (f"{rec.problem}. The results are kept in memory (shown here; export them to another disk if "
                f"you need them now) and the run is saved as soon as the store can be written again")

    def _save_loop(self) -> None:
        while self.unsaved and not self._closing.wait(SAVE_RETRY_S):
            self.save_pending()

    def save_pending(self) -> list[RunRecorder]:
        """Try to write every finished run the store refused so far; each one saved is
        announced (``on_run_saved``). Returns those still unsaved."""
        with self._lock:
            todo = list(self.unsaved)
        for rec in todo:
            try:
                ok = rec.save_pending()
            except Exception:
                log.exception("saving run %s failed", rec.run_id)
                ok = False
            if ok:
                with self._lock:
                    if rec in self.unsaved:
                        self.unsaved.remove(rec)
                    out = self._outcomes.pop(id(rec), None)
                if out is not None:
                    out.run_id, out.unsaved = rec.run_id, None
                self._emit("on_run_saved", rec.run_id)
        with self._lock:
            return list(self.unsaved)

    # ------------------------------------------------------------------ state
    def _set_state(self, state: State, reason: str = "") -> None:
        self.state = state
        self._emit("on_state", state, reason)

    def _emit(self, name: str, *args: Any) -> None:
        try:
            getattr(self.listener, name)(*args)
        except Exception:
            log.exception("run listener %s failed", name)

    @property
    def server_running(self) -> bool:
        return self.state in RUNNING_STATES

    @property
    def ready(self) -> bool:
        return self.state in (State.READY, State.ATTACHED)

    @property
    def ramp_running(self) -> bool:
        r = self._ramp
        return r is not None and not r.done.is_set()

    @property
    def ramp_spec(self) -> RampSpec | None:
        r = self._ramp
        return r.spec if r is not None else None

    # ------------------------------------------------------------------ launch
    def launch_defaults(self, target: LaunchTarget) -> LaunchTarget:
        """``target`` with the CPU build's working defaults filled in where the user set
        nothing (:func:`app.planner.launch_defaults.cpu_build_defaults`: a KV cache size, the
        in-process executor), for engine ``vllm`` on an interpreter with the CPU build;
        what was chosen goes to ``on_launch_defaults``. Once per target: the result has
        ``fill_defaults`` False. Every launch goes through it (:meth:`launch`); a front
        end that plans or records first (``vllm-dyno run``) calls it before. Blocking
        (interpreter probe, planner). Never raises: when the interpreter cannot be probed
        the target is left as it is and the launch reports why."""
        if not target.engine.runs_vllm or not target.fill_defaults or target.multi_host:
            return target  # a rig's interpreters are on its hosts: each agent fills in its own (_launch_rig)
        done = replace(target, fill_defaults=False)
        try:
            interp = inspect_interpreter(resolve_python(target.python))
        except Exception:  # InterpreterError, or no interpreter at all: the launch says so
            return done
        if not interp.is_cpu_build:
            return done
        try:
            d = cpu_build_defaults(target.config, vllm_version=interp.version)
        except Exception:  # defaults are a help: a failure here must not stop the launch
            log.exception("could not work out the CPU build's defaults")
            return done
        if d.chosen or d.notes:
            self._emit("on_launch_defaults", d)
        return replace(done, config=d.config)

    def launch(self, target: LaunchTarget, *, check_leftovers: bool = True) -> list:
        """Start the server of ``target`` (or attach to its URL). Blocking: the leftover
        search and the interpreter probe take up to seconds. Returns the leftover vLLM
        processes that hold GPU memory — those whose owning vLLM Dyno is gone
        (``kind == "orphaned"``; another running session's server, or one not started by
        vLLM Dyno, is never offered) — then nothing was started: end them with
        :func:`app.server.procs.end_leftovers` or launch with ``check_leftovers=False``,
        else ``[]``; readiness comes through :meth:`wait_ready` and ``on_state``. The CPU
        build's working defaults are filled in first (:meth:`launch_defaults`). Raises
        :class:`app.server.launch.LaunchError` for bad input (nothing started) and
        RuntimeError when a server is already up."""
        with self._lock:
            if self.server_running:
                raise RuntimeError("a server is already running in this session; stop it first")
            self.target = target
            self.time_scale, self.sim_info, self.failure = 1.0, {}, None
            self._rig_last = []
            self._failed.clear()
            self.bank = SeriesBank()
            self.client = ClientSeries()
            self._ready.clear()
        if not target.engine.launches:  # attach to the server at the URL
            self.url = (target.attach_url or "").rstrip("/")
            if not self.url:
                raise ValueError("attach: give the server's URL (attach_url), e.g. http://127.0.0.1:8000")
            self.api_model = target.attach_model or None
            self.sim_info = sim_info(self.url)
            self.time_scale = time_scale_of(self.sim_info)
            self.client.time_scale = self.time_scale
            self._start_telemetry(None, at_ready=True)
            self._set_state(State.ATTACHED, self.url)
            self._ready.set()
            return []
        self._set_state(State.STARTING, "checking")
        try:
            if check_leftovers:
                left = [p for p in procs.find_leftovers() if p.gpu_bytes and p.endable]
                if left:
                    self._set_state(State.IDLE, "leftover processes hold GPU memory")
                    return left
            target = self.launch_defaults(target)
            self.target = target
            self._load_launch_history(target)
            exposed = None if target.expose else exposure_problem(target.config.host)
            if exposed:  # binding beyond loopback needs the user's word (--expose, the window's dialog)
                raise LaunchError(exposed)
            grace = target.grace if target.grace is not None else target.engine.spec.stop_grace_s
            if target.multi_host:
                self._launch_rig(target, grace)
                return []
            sup = Supervisor(target.config, engine=target.engine, python=target.python, sim_args=target.sim_args,
                             startup_timeout=target.startup_timeout, grace=grace, clock=self.clock)
            sup.on_line(self._line)
            sup.on_state(functools.partial(self._on_server_state, sup))
            self.supervisor = sup
            sup.start()  # raises LaunchError for bad input, before starting anything
        except Exception as e:
            self.supervisor = None
            self._close_rig(10.0)
            self.failure = (str(e), None)
            self._failed.set()
            self._set_state(State.FAILED, str(e))
            self._emit("on_launch_failed", str(e), None)
            self._ready.set()
            raise
        self.url = sup.url
        self.api_model = target.config.api_model_name
        if target.engine.spec.samples_from_launch:
            self._start_telemetry(sup, at_ready=False)  # the cards from the first second of the launch
        return []

    # ------------------------------------------------------------------ a rig of hosts (issue 21)
    def _launch_rig(self, target: LaunchTarget, grace: float) -> None:
        """Start the server of ``target`` over its hosts: open every host's agent (the rig),
        probe them and refuse a layout with an error finding (app.hosts.checks), make the
        launch plan of the config's backend (app.hosts.plan.launch_plan; NCCL/Gloo on the
        interface that holds each host's address), start the head's part, then the others'
        (the headless parts connect to the head's data-parallel RPC port or torch.distributed
        master, which the head opens), and follow every part's state and every agent's
        channel. The Ray backend: each host's ``ray start --block`` node first (the agent's
        ``ray`` part, supervised and reaped as the server is), then — once every node said
        :data:`RAY_STARTED` within ``rig_timeout`` — the head's ``vllm serve``. The head's
        ``ready`` makes the controller ready; the URL is the head's API server. Raises
        LaunchError (an agent that cannot be started, a finding, a plan the hosts cannot
        run, a part the agent refused: each names the host); the caller closes the rig."""
        self._rig_stopping = False
        self._rig_grace = grace
        self.rig_parts, self.rig_plan, self._rig_last, self._rig_probes = {}, [], [], []
        rig = Rig(target.hosts, clock=self.clock, ssh=target.ssh)
        self.rig = rig
        try:
            rig.open(timeout=target.rig_timeout)
        except HostError as e:  # names the host and the fix
            raise LaunchError(str(e)) from None
        rig.on_lost(self._host_lost)
        probes = [rig.call(link.probe(target.config.model), target.rig_timeout) for link in rig.links]
        self._rig_probes = probes
        try:
            plan = launch_plan(target.hosts, target.config, ray_address=target.ray_address,
                               interfaces=socket_interfaces(target.hosts, probes))
        except PlanError as e:
            raise LaunchError(str(e)) from None
        # the rig's problems, each host's command against its vLLM version included
        errors = [f for f in rig_findings(target.hosts, probes, plan, engine=target.engine) if f.level == "error"]
        if errors:
            raise LaunchError("the rig cannot run this launch: " + "; ".join(str(f) for f in errors))
        self.rig_plan = plan
        if target.telemetry:
            rig.subscribe(self.bank)
            rig.subscribe(self._samples)
            rig.watch()
        links = {link.host.label(): link for link in rig.links}
        started: dict[str, threading.Event] = {}  # a Ray node's host → it said RAY_STARTED
        for cmd in plan:  # the head first: the others join it (Ray: the nodes, then the head's server)
            h, ray = cmd.host.label(), cmd.kind == "ray"
            link = links[h]
            if not ray and started:
                self._wait_ray_cluster(started, target.rig_timeout)
            tag = f"[{h} ray]" if ray else f"[{h}]"
            if ray:
                started[h] = threading.Event()
            link.on_log(functools.partial(self._rig_line, tag, started=started.get(h) if ray else None),
                        part=cmd.part)
            link.on_state(functools.partial(self._on_host_state, h, cmd.role), part=cmd.part)
            try:  # the CPU build's working defaults: each agent for its own host (its interpreter, cores)
                launched = rig.call(link.launch(cmd.config, engine=Engine.RAY if ray else target.engine,
                                                sim_args=list(cmd.args) if ray else target.sim_args, part=cmd.part,
                                                expose=target.expose, startup_timeout=target.startup_timeout,
                                                fill_defaults=(not ray and target.fill_defaults
                                                               and target.engine.runs_vllm)),
                                    target.rig_timeout)
            except HostError as e:
                raise LaunchError(f"host {h} ({cmd.role}) did not start its part: {e}") from None
            self.rig_parts[_part_key(cmd)] = launched
            if cmd.role == "head":
                self.url = launched["url"]
            d = launched.get("defaults")
            if d and (d.get("chosen") or d.get("notes")):
                self._emit("on_launch_defaults", LaunchDefaults(config=cmd.config, fix=d.get("fix") or {},
                                                                chosen=list(d.get("chosen") or []),
                                                                notes=list(d.get("notes") or []), host=h))
            self._emit("on_rig_part", {"host": h, "role": cmd.role, "rank": cmd.rank, **launched})
        self.api_model = target.config.api_model_name

    def _rig_line(self, tag: str, stream: str, text: str, t: float, started: threading.Event | None) -> None:
        """The rig's thread: a line of a host's part; a Ray node's :data:`RAY_STARTED` sets ``started``."""
        if started is not None and RAY_STARTED in text:
            started.set()
        self._line(stream, f"{tag} {text}", t)

    def _wait_ray_cluster(self, started: dict[str, threading.Event], timeout: float) -> None:
        """Wait until every Ray node of the plan said :data:`RAY_STARTED` (its ``ray start``
        log); raises LaunchError naming the hosts not up within ``timeout`` s, or the lost
        host (a node's part that failed fails the run first, :meth:`_host_failed`)."""
        deadline = time.monotonic() + timeout
        while not all(e.is_set() for e in started.values()):
            if self.failure is not None:
                raise LaunchError(self.failure[0])
            if time.monotonic() > deadline:
                late = ", ".join(h for h, e in started.items() if not e.is_set())
                raise LaunchError(f"the Ray cluster did not come up within {timeout:.0f} s: host(s) {late} never "
                                  f"said {RAY_STARTED!r} (see their [host ray] log lines); check that each host "
                                  "reaches the head's Ray port, or raise the rig timeout")
            time.sleep(0.1)

    def _on_host_state(self, host: str, role: str, st: dict[str, Any]) -> None:
        """The rig's thread: a host's server part changed state (its agent's message)."""
        state = st.get("state")
        if self.rig is None or self._rig_stopping:
            return
        if state == "loading" and self.state == State.STARTING:
            self._set_state(State.LOADING, f"host {host}")
        elif state == "ready" and role == "head":
            self._background("rig-ready", self._rig_ready)  # HTTP and the store: off the rig's loop
        elif state == "failed":
            self._host_failed(host, f"its server part ({role}) failed: {st.get('reason') or 'no reason given'}")
        elif state == "stopped":
            self._host_failed(host, f"its server part ({role}) stopped")

    def _rig_ready(self) -> None:
        """The head's API server answered: the rig is ready (as :meth:`_on_server_state`
        for one server)."""
        if self.rig is None or self.failure is not None:
            return
        if self.target is not None and self.target.engine.simulated and self.url:
            self.sim_info = sim_info(self.url)
            self.time_scale = time_scale_of(self.sim_info)
        self.client.time_scale = self.time_scale
        self._start_telemetry(None, at_ready=True)  # the head's /metrics
        rec = self.run
        if rec is not None:
            self._attach_run(rec)
        self._set_state(State.READY, self.url or "")
        self._ready.set()

    def _host_lost(self, host: str, why: str) -> None:
        """The rig's thread: a host's agent channel ended without our close."""
        self._host_failed(host, f"{why} (its agent is gone; its server part is ended with it)")

    def _host_failed(self, host: str, what: str) -> None:
        """A host of the rig was lost: the run fails naming it, and every other host's
        server part is ended now (off the rig's thread) rather than left to hang."""
        if self.rig is None or self._rig_stopping or self.failure is not None:
            return
        self._fail(f"host {host} was lost: {what}", None)
        self._background("rig-end-parts", lambda: self._stop_rig_parts(exclude=host))

    def _stop_rig_parts(self, exclude: str | None = None) -> list[int]:
        """Stop every host's server part through its agent (SIGTERM, the grace, SIGKILL to
        its group); the pids still alive after, of all hosts."""
        rig = self.rig
        if rig is None:
            return []
        grace = self._rig_grace

        async def all_() -> list[Any]:
            return await asyncio.gather(*(link.stop(grace) for link in rig.links
                                          if not link.closed and link.host.label() != exclude),
                                        return_exceptions=True)
        try:
            results = rig.call(all_(), grace + 60.0)
        except Exception:
            log.exception("could not stop the rig's server parts")
            return []
        left: list[int] = []
        for r in results:
            if isinstance(r, list):
                left += r
            elif isinstance(r, BaseException):
                log.warning("a host's server part did not stop cleanly: %s", r)
        return left

    def _close_rig(self, timeout: float = 60.0) -> list[int]:
        """End every host's server part and close the agents (idempotent); leftovers."""
        rig = self.rig
        left: list[int] = []
        if rig is None:
            return left
        self._rig_stopping = True
        try:
            left = self._stop_rig_parts()
        finally:
            try:
                rig.close(timeout)
            except Exception:
                log.exception("could not close the rig")
            self._rig_last = self.rig_status()  # the view keeps how each host ended
            self.rig = None
        return left

    def rig_status(self) -> list[dict[str, Any]]:
        """The hosts of the launched rig, one plain dict each in the profile's order (``[]``
        for a one-host launch; the last rig's as it was closed once it is). Safe from any
        thread: it only reads what the rig's thread writes (each link's hello, states,
        offset, ``lost``). Keys: ``host`` (its label, the SSH destination), ``role``
        (``head``/``headless``, a Ray node ``ray-worker``; ``""`` before the plan), ``rank``
        (node rank or first DP rank, app.hosts.plan; None before the plan), ``state``
        (``connecting`` until its agent's hello, ``starting`` until its part's first state
        message — the head's server part on a host with two parts — then that message's:
        ``loading``/``ready``/``failed``/``stopped``…; ``lost`` when its agent's channel
        ended without our close), ``reason`` (why it failed or was lost; ``""``), a headless
        part or Ray node counts as ready once the head is (it reports no readiness itself);
        ``hostname``, ``cards`` (the hello's NVML card names; ``[]``: none, the CPU build),
        ``offset_s``/``bound_s``/``rtt_s`` (its clock − the session's, the bound and the round
        trip of the exchange used, s, app.hosts.protocol.ClockOffset; None before measured),
        ``drift_ppm`` (None before two offsets 1 s apart)."""
        rig = self.rig
        if rig is None:
            return [dict(r) for r in self._rig_last]
        plan = {c.host.label(): c for c in list(self.rig_plan)}
        links = {link.host.label(): link for link in list(rig.links)}
        rows: list[dict[str, Any]] = []
        for host in rig.hosts:
            h = host.label()
            link, cmd = links.get(h), plan.get(h)
            row: dict[str, Any] = {"host": h, "role": cmd.role if cmd else "", "rank": cmd.rank if cmd else None,
                                   "state": "connecting", "reason": "", "hostname": "", "cards": [],
                                   "offset_s": None, "bound_s": None, "rtt_s": None, "drift_ppm": None}
            if link is not None:
                part = cmd.part if cmd else "server"
                hello, off = link.hello, link.offset
                states = [s for s in list(link.states) if s.get("part", "server") == part]
                last = states[-1] if states else {}
                row.update(hostname=str(hello.get("hostname") or ""),
                           cards=[str(c.get("name") or "GPU") for c in hello.get("cards") or []],
                           state=str(last.get("state") or "starting"),
                           reason=str(last.get("reason") or "") if last.get("state") == "failed" else "",
                           drift_ppm=link.drift_ppm)
                if off is not None:
                    row.update(offset_s=off.offset_s, bound_s=off.bound_s, rtt_s=off.rtt_s)
                if link.lost:
                    row.update(state="lost", reason=link.lost)
            rows.append(row)
        # a headless part has no API server of its own to answer: its agent reports it
        # loading until it ends. The head's is ready only once every rank joined (DP: the
        # engines' handshake, vllm/v1/engine/utils.py wait_for_engine_startup, vLLM 0.32.0;
        # PP: the world's torch.distributed init), so with the head ready so are they.
        if any(r["role"] == "head" and r["state"] == "ready" for r in rows):
            for r in rows:
                if r["role"] in ("headless", "ray-worker") and r["state"] == "loading":
                    r["state"] = "ready"
        return rows

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the server is ready (or attached); False when it failed, was
        stopped or ``timeout`` (s) passed."""
        self._ready.wait(timeout)
        return self.ready

    def stop_waiting(self) -> None:
        """Wake every :meth:`wait_ready` now (an abort while the server comes up); the
        launch itself goes on until :meth:`stop`."""
        self._ready.set()

    def _line(self, stream: str, text: str, t: float) -> None:
        rec = self._recorder()
        if rec is not None:
            rec.add_log_line(stream, text, t)
        self._emit("on_line", stream, text, t)
        sup = self.supervisor
        if sup is not None and sup.parser.facts.phase != self._phase_seen:
            self._phase_seen = sup.parser.facts.phase
            p = self.launch_progress()
            if p is not None:
                self._emit("on_launch_phase", p)

    # ------------------------------------------------------------------ launch timing
    def _load_launch_history(self, target: LaunchTarget) -> None:
        """The earlier ready launches of this configuration, for the expected time left
        (a store that cannot be read only means no estimate)."""
        self._phase_seen = None
        self.launch_key = launch_key(target.engine, target.config, target.sim_args, target.python)
        try:
            self.launch_expected = expected_phases(self.store.launches(self.launch_key, HISTORY))
        except Exception as e:  # the estimate is a help: a store problem must not stop a launch
            log.debug("no launch history: %s", e)
            self.launch_expected = None

    def _save_launch_timing(self, sup: Supervisor) -> None:
        """The launch became ready: keep its phase times for the next launch of it."""
        if self.launch_key is None or sup.started_t is None or self.target is None:
            return
        ready_s = max(0.0, self.clock.now() - sup.started_t)
        try:
            self.store.add_launch(self.launch_key, self.target.engine, ready_s, sup.launch_phases())
        except Exception as e:  # a full or read-only store: the next launch has no estimate, nothing else
            log.info("launch time not kept: %s", e)

    def launch_progress(self) -> LaunchProgress | None:
        """Where the launch is (phase from the log, elapsed s, expected s left after an
        earlier launch of the same configuration); None without a launched server."""
        sup = self.supervisor
        if sup is None or sup.started_t is None:
            return None
        f = sup.parser.facts
        return progress(f.phase, dict(f.phase_times), sup.started_t, self.clock.now(), self.launch_expected)

    def _on_server_state(self, sup: Supervisor, ch: StateChange) -> None:
        """Supervisor thread: follow the server's states."""
        if sup is not self.supervisor:
            return  # a stale supervisor's late news
        st = ch.state.value
        if st == "loading":
            self._set_state(State.LOADING, ch.reason)
        elif st == "ready":
            if self.target is not None and self.target.engine.simulated:
                self.sim_info = sim_info(sup.url)
                self.time_scale = time_scale_of(self.sim_info)
            self.client.time_scale = self.time_scale
            self._start_telemetry(sup, at_ready=True)
            self._save_launch_timing(sup)
            rec = self.run
            if rec is not None:
                self._attach_run(rec)
            self._set_state(State.READY, sup.url)
            self._ready.set()
        elif st == "failed":
            diag = None
            try:
                diag = diagnose(sup.log_tail(400), sup.silent_for(), after_ready=sup.was_ready,
                                killed_by=sup.server_signal, pids=sup.member_pids)
            except Exception:
                log.exception("diagnosis failed")
            self._fail(ch.reason, diag)
        elif st == "stopping" and self.state not in (State.FAILED, State.STOPPING):
            self._set_state(State.STOPPING, ch.reason)
        elif st == "stopped" and self.state != State.FAILED:
            self._ready.set()

    def _fail(self, reason: str, diag: Diagnosis | None) -> None:
        """The server failed (to start, or after it was ready): record, stop the ramp and
        telemetry, tell the listener."""
        self.failure = (reason, diag)
        self._failed.set()
        r = self._ramp
        if r is not None:
            r.aborted.set()
            if r.gen is not None:
                r.gen.abort()
        self._teardown_telemetry()
        self._set_state(State.FAILED, reason)
        self._emit("on_launch_failed", reason, diag)
        self._ready.set()

    def _server_died(self, records: list, stop_reason: str = "", wait: float = 15.0) -> bool:
        """A ramp ended badly: did the server die under it? A launched server: its
        process has exited (or exits within 5 s while ``/health`` does not answer) or
        ``/health`` answers 5xx — then wait (up to ``wait`` s) for the supervisor's
        failure, diagnosed from the log. An attached server (its log is
        not ours): ``/health`` answers 5xx or nothing at all — the failure is set here
        (with the ramp's ``stop_reason``), diagnosed from what the failed requests said."""
        if self.failure is not None:
            return True
        if self.rig is not None:  # a lost host is reported by its agent (or its channel's end)
            return self._failed.wait(wait)
        sup, url = self.supervisor, self.url
        if sup is not None:
            deadline = time.monotonic() + 5.0  # a server that does not answer: exiting, or only slow
            while True:
                if sup.state.value in ("stopping", "stopped"):
                    return False  # stopped on request (a failure stays "failed")
                if sup.state.value == "failed" or sup.exited:
                    return self._failed.wait(wait)
                code = health_status(sup.url)
                if code is not None:
                    return self._failed.wait(wait) if code >= 500 else False
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.2)
        if url is None or self.target is None or self.target.engine.launches:
            return False
        code = health_status(url, timeout=3.0)
        if code is not None and code < 500:
            return False
        said = f"/health answered {code}" if code is not None else "it stopped answering (/health too)"
        errors = [r.error for r in records if getattr(r, "error", None)][-20:]
        diag = None
        try:
            diag = diagnose(errors, after_ready=True)
        except Exception:
            log.exception("diagnosis failed")
        dead = code is not None or (diag is not None and bool(diag.evidence))  # 503, or vLLM's EngineDeadError
        what = "its engine died" if dead else "it died or cannot be reached"
        reason = f"the server at {url} was ready, then {said}: {what}" + (f" — the ramp: {stop_reason}"
                                                                          if stop_reason else "")
        if diag is not None and diag.problem == "engine_dead":
            got = f" (the requests got: {diag.evidence[0]})" if diag.evidence else ""
            diag.explanation = (f"the server was ready, then {said}: {what}{got}. It cannot serve any more; the "
                                f"cause is in its own log, which is not read when attached: `vllm-dyno diagnose "
                                f"LOGFILE` finds it.")
        self._fail(reason, diag)
        return True

    @property
    def failure_text(self) -> str:
        """The failure with its diagnosis, one paragraph (empty when nothing failed)."""
        if self.failure is None:
            return ""
        reason, diag = self.failure
        return reason + (f"\n{diag.summary()}" if diag is not None else "")

    # ------------------------------------------------------------------ telemetry
    def _start_telemetry(self, sup: Supervisor | None, at_ready: bool) -> None:
        t = self.target
        if t is None or not t.telemetry:
            return
        cpu_build = sup is not None and sup.interpreter is not None and sup.interpreter.is_cpu_build
        gpu_source: GpuSource | None = None
        try:
            if t.engine.resolved(bool(self.sim_info)).spec.card_samples is CardSamples.SIM_HTTP:
                if at_ready and self.url:
                    gpu_source = HttpGpuSource(self.url)  # the rig serves its cards once it is up (attached too)
            elif t.use_nvml and not cpu_build and self.rig is None:  # a rig's cards come from its agents
                gpu_source = NvmlSource(t.config.gpus, server_pgid=sup.pgid if sup else None)
            metrics_url = self.url if at_ready else None  # /metrics is served from ready on
            tel = Telemetry(clock=self.clock, gpu_source=gpu_source, metrics_url=metrics_url,
                            pgid=sup.pgid if sup else None, host=sup is not None, bank=self.bank,
                            gpu_interval=t.gpu_interval, metrics_interval=t.metrics_interval)
            tel.subscribe(self._samples)
        except Exception:
            log.exception("telemetry could not start; the run goes on without it")
            return
        with self._lock:
            old, self.telemetry = self.telemetry, tel.start()
        if old is not None:
            self._background("telemetry-stop", old.stop)

    def _samples(self, samples: list) -> None:
        rec = self._recorder()
        if rec is not None:
            rec.add_samples(samples)

    def _teardown_telemetry(self) -> None:
        with self._lock:
            tel, self.telemetry = self.telemetry, None
        if tel is not None:
            self._background("telemetry-stop", tel.stop)

    def _background(self, name: str, fn: Callable[[], Any]) -> None:
        def body() -> None:
            try:
                fn()
            except Exception:
                log.exception("%s failed", name)

        t = threading.Thread(target=body, name=name, daemon=True)
        t.start()
        self._bg = [x for x in self._bg if x.is_alive()] + [t]

    # ------------------------------------------------------------------ recording
    def _recorder(self) -> RunRecorder | None:
        r = self._ramp
        if r is not None and r.recorder is not None and r.recorder.open:
            return r.recorder
        rec = self.run
        return rec if rec is not None and rec.open else None

    def _new_recorder(self, record: RecordSpec, spec: RampSpec | dict[str, Any] | None = None) -> RunRecorder:
        prof = record.profile
        t = self.target
        engine = prof.engine if prof is not None else (Engine.SIM if self.sim_info else
                                                       (t.engine if t else Engine.ATTACH))
        name = record.name or (prof.name if prof is not None else f"ramp {self.url or ''}".strip())
        gpu_count = 1
        if prof is not None:
            try:
                gpu_count = prof.server_config(resolve=False).world_size
            except Exception:
                gpu_count = 1
        return RunRecorder(self.store, name=name, engine=engine, profile_data=prof.to_data() if prof else None,
                           spec=spec, plan=record.plan, gpu_count=gpu_count, clock_wall0=self.clock.wall0)

    def _attach_run(self, rec: RunRecorder) -> None:
        """The server's config, log, hardware and time scale into an open run."""
        sup = self.supervisor
        try:
            if sup is not None:
                rec.attach_server(sup)
            t = self.target
            # an attached sim is recorded as one, with its cards (compare counts them)
            engine = (t.engine if t is not None else Engine.ATTACH).resolved(bool(self.sim_info))
            if self.rig is not None:  # a rig's cards are its hosts', from their agents' hellos
                hw = self._rig_hardware(engine)
                # each host's part: its config, the argv its agent ran, the CPU build's defaults it filled in
                rec.set_context(hosts=[{"host": c.host.label(), "role": c.role, "rank": c.rank,
                                        "server": c.config.model_dump(mode="json"),
                                        "argv": (self.rig_parts.get(_part_key(c)) or {}).get("argv") or [],
                                        "defaults": (self.rig_parts.get(_part_key(c)) or {}).get("defaults")}
                                       for c in self.rig_plan])
            else:
                hw = hardware_for(engine, supervisor=sup, info=self.sim_info,
                                  gpus=t.config.gpus if t is not None else None)
            self.hardware = hw
            rec.set_context(hardware=hw, time_scale=self.time_scale, model=self.api_model)
            if hw is not None and (engine.simulated or self.rig is not None):
                rec.gpu_count = hw.count
        except Exception:
            log.exception("could not record the server of run %s", rec.run_id)

    def _rig_hardware(self, engine: Engine) -> HardwareFingerprint | None:
        """The launched rig's fingerprint (app.run.hardware.rig_hardware): its hosts' cards
        from their agents' hellos (the sim's from the head's ``/sim/info``), the head's vLLM
        version from its probe; None without a rig."""
        rig = self.rig
        if rig is None:
            return None
        hellos = {link.host.label(): link.hello for link in list(rig.links)}
        head = (self._rig_probes[0].get("vllm") or {}) if self._rig_probes else {}
        version = head.get("version") if engine.runs_vllm else None
        return rig_hardware(engine, rig.hosts, [hellos.get(h.label()) or {} for h in rig.hosts], info=self.sim_info,
                            vllm_version=version)

    def open_run(self, record: RecordSpec) -> int | None:
        """Open a run that spans the launch (``vllm-dyno run``): a failed launch is
        recorded in it; the next ramp records into it and leaves it open; close it with
        :meth:`close_run`. Returns the run id (None while the store refuses the run: it is
        kept in memory, :attr:`RunRecorder.problem`)."""
        spec = record.profile.ramp.model_dump(mode="json") if record.profile is not None else None
        self.run = self._new_recorder(record, spec)
        if self.ready:
            self._attach_run(self.run)
        return self.run.run_id

    def close_run(self, status: str, reason: str = "", knee: Knee | None = None,
                  error: str | None = None, outcome: "RampOutcome | None" = None,
                  ) -> tuple[dict[str, Any], ResultsSummary | None] | None:
        """Finish the run opened by :meth:`open_run` (summary written); None without one."""
        rec, self.run = self.run, None
        if rec is None:
            return None
        if self.supervisor is not None and rec.supervisor is None:
            try:
                rec.attach_server(self.supervisor)
            except Exception:
                log.exception("could not record the server of run %s", rec.run_id)
        closed = rec.finish(status, reason, knee, error=error, verdict=outcome.verdict if outcome else None,
                            users_at_slo=outcome.capacity if outcome else None)
        if not rec.saved:
            if outcome is not None:
                outcome.unsaved = rec.problem
            self._emit("on_record_failed", self._keep_unsaved(rec, outcome))
        return closed

    # ------------------------------------------------------------------ ramps
    def start_ramp(self, spec: RampSpec, *, record: RecordSpec | None = None,
                   safety: SafetyLimits | NoSafety | None = None) -> None:
        """Start a ramp against the ready server and return at once. ``spec``: a
        :class:`app.loadgen.spec.RampSpec` in rig seconds (its ``url`` this server's);
        ``record``: record it as a run (ignored while a run opened by :meth:`open_run` is
        open: the ramp records into that one); ``safety``: the stops it runs with
        (:func:`app.run.safety.resolve_safety`) — None: the user's Settings (every front
        end's default); a SafetyLimits: those (``ramp --max-failure-rate``);
        :data:`app.run.safety.NO_SAFETY`: none (no thermal stop, the spec's own
        failure-rate limit). Progress through the listener; the end through
        ``on_ramp_done`` and :meth:`wait_ramp`."""

        if self.target is not None and self.target.engine.spec.may_be_sim and not self.sim_info \
                and self.url is not None:
            # attached while the server was still starting (/sim/info did not answer then): a sim
            # found only now must not be measured at k = 1 (every rig figure, and its server
            # figures against the client's, would be off by k)
            info = sim_info(self.url)
            if info:
                self.sim_info = info
                self.time_scale = self.client.time_scale = time_scale_of(info)
        limits = resolve_safety(safety)
        with self._lock:
            if self.ramp_running:
                raise RuntimeError("a ramp is already running; abort it first")
            if not self.ready:
                raise RuntimeError("no server is ready: launch (or attach to) one first")
            r = _Ramp(apply_safety(spec, limits), record, limits)
            self._ramp = r
        # A full (generation-2) collection walks every object of the process (the GUI's
        # Qt wrappers, pyqtgraph, pydantic models) and stopped its event loop for ≈ 55 ms
        # mid-ramp (benchmarks/gui_stall.py). Collect once now and move the survivors to
        # the permanent generation, so that the ramp's collections only walk what it makes.
        gc.collect()
        gc.freeze()
        self.client.reset()
        self._emit("on_ramp_started", r.spec)
        r.thread = threading.Thread(target=self._ramp_main, args=(r,), name="ramp", daemon=True)
        r.thread.start()

    def ramp(self, spec: RampSpec, *, record: RecordSpec | None = None, safety: SafetyLimits | NoSafety | None = None,
             timeout: float | None = None) -> RampOutcome:
        """Run a ramp to its end (blocking) and return its outcome; on ``timeout`` (s) it
        is aborted and what it completed is returned. ``safety``: as :meth:`start_ramp`."""
        self.start_ramp(spec, record=record, safety=safety)
        out = self.wait_ramp(timeout)
        if out is None:
            self.abort_ramp("the ramp ran past its time limit")
            out = self.wait_ramp()
        assert out is not None
        return out

    def wait_ramp(self, timeout: float | None = None) -> RampOutcome | None:
        """The outcome of the current (or last) ramp once it ended; None on timeout."""
        r = self._ramp
        if r is None:
            return None
        if not r.done.wait(timeout):
            return None
        return r.outcome

    def abort_ramp(self, reason: str | None = None) -> None:
        """Ask the running ramp to stop (completed levels are kept; returns at once).
        ``reason``: why, shown as the ramp's stop reason."""
        r = self._ramp
        if r is None or r.done.is_set():
            return
        with r.lock:
            if reason and not r.abort_reason:
                r.abort_reason = reason
            r.aborted.set()
        gen = r.gen
        if gen is not None:
            self._background("ramp-abort", gen.abort)

    def _ramp_main(self, r: _Ramp) -> None:
        k = self.time_scale
        spec = r.spec
        try:
            if self.run is None and r.record is not None:
                try:
                    r.recorder = self._new_recorder(r.record, spec)
                    self._attach_run(r.recorder)
                except Exception as e:  # the ramp still runs; the user is told it is not recorded
                    log.exception("the run could not be recorded")
                    self._emit("on_record_failed", f"the ramp is not recorded: {e}")
            elif self.run is not None:
                self.run.set_context(spec=spec)
            rec = self._recorder()
            if rec is not None and spec.prompts_file is not None:
                try:  # the dataset's lengths with the run (config["lengths"]); the spec was validated with it
                    rec.set_context(lengths=dataset_lengths(spec))
                except ValueError:
                    log.exception("the dataset's lengths are not recorded")
            api_key = self.target.config.env.get("VLLM_API_KEY") if self.target is not None else None

            def on_records(recs: list) -> None:
                self.client.add(recs)
                rr = self._recorder()
                if rr is not None:
                    rr.add_records(recs)
                self._emit("on_records", recs)

            def on_level_start(ev: dict) -> None:
                if ev.get("mode") == "rate" and k != 1.0:  # a wall rate → req per rig second, as the levels
                    ev = {**ev, "level": ev.get("level", 0) / k}
                self.client.level_started(ev.get("t", self.clock.now()), ev.get("level", 0))
                self._emit("on_level_start", ev)

            def on_level(st: StepStats) -> None:
                rig = with_notes(to_rig_time(st, k), k)  # client vs server compared in rig seconds
                with r.lock:
                    r.steps = sorted([s for s in r.steps if s.idx != rig.idx] + [rig], key=lambda s: s.idx)
                rr = self._recorder()
                if rr is not None:
                    rr.add_level(rig)
                self._emit("on_level", rig)

            gen = LoadGenerator(spec_to_wall(spec, k), clock=self.clock, api_key=api_key, on_records=on_records,
                                on_level_start=on_level_start, on_level=on_level)
            r.gen = gen
            try:
                gen.start()
                next_check = 0.0
                while gen.running:
                    if r.aborted.is_set():
                        gen.abort()
                    gen.wait(0.1)
                    now = time.monotonic()
                    if now >= next_check:
                        next_check = now + CHECK_INTERVAL_S
                        self._check_safety(r)
                res = gen.wait()
            finally:
                gen.stop()
                self.client.ramp_ended(self.clock.now())
            out = self._outcome(r, res, k)
        except Exception as e:  # an unexpected failure still ends the ramp and is recorded
            log.exception("ramp failed")
            out = RampOutcome("error", f"{type(e).__name__}: {e}", error=f"{type(e).__name__}: {e}",
                              steps=list(r.steps), time_scale=k)
        rec = r.recorder
        if rec is not None:
            try:
                if out.status == "error" and not out.records and not out.steps and r.record is not None \
                        and r.record.profile is None:
                    rec.discard()  # nothing ran (`vllm-dyno ramp`'s failed pre-flight check): no run
                else:
                    out.summary, out.results = rec.finish(out.status, out.stop_reason, out.knee, error=out.error,
                                                          verdict=out.verdict, users_at_slo=out.capacity)
                    if rec.saved:
                        out.run_id = rec.run_id
                    else:
                        out.unsaved = rec.problem
                        self._emit("on_record_failed", self._keep_unsaved(rec, out))
            except Exception as e:
                log.exception("could not complete run %s", rec.run_id)
                self._emit("on_record_failed", f"run {rec.run_id} could not be completed in the store: {e}")
        elif self.run is not None:
            out.run_id = self.run.run_id
        r.outcome = out
        r.done.set()
        self._emit("on_ramp_done", out)

    def _check_safety(self, r: _Ramp) -> None:
        """Ramp thread, every CHECK_INTERVAL_S: thermal limit, a failed server."""
        s = r.safety
        if s is not None and s.enabled and not r.safety_reason:
            reason = thermal_stop_reason(self.bank, s.thermal_margin_c)
            if reason:
                with r.lock:
                    r.safety_reason = reason
                r.aborted.set()
                if r.gen is not None:
                    r.gen.abort()
                self._emit("on_safety_stop", reason)
        if self.failure is not None and r.gen is not None:
            r.gen.abort()

    def _ended_by_server(self, r: _Ramp, res: RampResult, status: str) -> bool:
        """Whether a ramp's end may be the server's doing: it failed, or stopped on a
        failure-rate or generator error — not an abort asked for by the user, and not a
        pre-flight failure with no request sent (an unreachable URL is not a death)."""
        if self.failure is not None:
            return status not in OK_STATUSES
        if status in OK_STATUSES or (status == "aborted" and r.abort_reason):
            return False
        return bool(res.records)

    def _outcome(self, r: _Ramp, res: RampResult, k: float) -> RampOutcome:
        """The generator's result → the ramp's outcome in rig seconds."""
        with r.lock:
            steps = list(r.steps)
        status, reason = res.status, res.stop_reason or (res.error or "")
        if r.safety_reason:
            status, reason = "safety", r.safety_reason
        elif self._ended_by_server(r, res, status) and self._server_died(list(res.records), reason):
            status, reason = "server_failed", self.failure_text
        elif status == "aborted" and r.abort_reason:
            reason = r.abort_reason
        reason = rig_stop_reason(status, reason, steps)
        knee = find_knee(steps, r.spec.knee_gain, r.spec.knee_ttft_ratio)
        out = RampOutcome(status, reason, error=res.error, model=res.model, steps=steps, knee=knee,
                          records=list(res.records), time_scale=k)
        if steps and status in OK_STATUSES:
            try:
                out.capacity, out.verdict = self._verdict(r, steps, res.records, res.model)
            except Exception:  # the answer is a summary: a failure here must not lose the measured levels
                log.exception("could not compute the verdict")
        return out

    def _verdict(self, r: _Ramp, steps: list[StepStats], records: list,
                 served: str | None = None) -> tuple[Capacity, Verdict]:
        """Users at the SLO (:func:`app.loadgen.capacity.capacity_of`: a search's answer, or
        the ramp's levels judged alike) and the verdict: the rig, the server's options,
        what the server and cards showed at the level that broke the SLO, J/token at the
        capacity level and the prices from Settings. ``served``: the model name the load
        generator found (an attached server's)."""
        spec, k = r.spec, self.time_scale
        search = spec.search or CapacitySearch(start=min(s.level for s in steps), max_level=max(s.level for s in steps))
        cap = capacity_of(steps, records_to_rig(records, k), spec.slo, search, spec.mode,
                          {s.idx: s.repeat for s in steps}, seed=spec.seed)
        cap.shape = spec.shape
        t = self.target
        engine = t.engine if t is not None else Engine.ATTACH
        measured = Engine.SIM if self.sim_info else engine  # an attached sim: its rig's cards
        hw = self.hardware
        if hw is None and measured.planned:  # not recorded: read it now
            try:
                hw = hardware_for(measured, supervisor=self.supervisor, info=self.sim_info,
                                  gpus=t.config.gpus if t is not None else None)
            except Exception:
                log.exception("could not read the hardware for the verdict")
        if hw is not None:
            rig = hw.cards_text() + (" (sim)" if engine.simulated or self.sim_info else "")
            gpus = hw.count
        else:
            rig, gpus = f"the server at {self.url}", 1
        config = t.config.model_dump() if t is not None and engine.launches else None
        if config is not None:
            gpus = max(gpus if hw is not None else 1,
                       (config.get("tensor_parallel_size") or 1) * (config.get("pipeline_parallel_size") or 1))
        best = next((s for s in steps if s.level == cap.users), None)
        nxt = next((s for s in steps if s.level == cap.next_users), None)
        jpt = self.energy(best).j_per_token if best is not None else None
        obs = observe(self.bank, nxt, k) if nxt is not None and self.bank is not None else None
        (p_lo, p_hi), (o_lo, o_hi) = spec.length_range("prompt_tokens"), spec.length_range("output_tokens")
        prices = load_settings().pricing
        plan = r.record.plan if r.record is not None else (self.run.plan if self.run is not None else None)
        model = (model_label(t.config.model) if t is not None and config is not None
                 else (self.api_model or served or "the model"))
        verdict = build_verdict(cap, steps, rig=rig, model=model, gpus=gpus, config=config, observation=obs,
                                j_per_token=jpt, pricing=prices, plan=plan,
                                mean_tokens=(p_lo + p_hi + o_lo + o_hi) / 2, has_slo=not spec.slo.is_empty())
        return cap, verdict

    # ------------------------------------------------------------------ energy
    def energy(self, st: StepStats) -> LevelEnergy:
        """Power (W) and J/token of level ``st`` (rig seconds) from the live GPU power
        samples (:func:`app.telemetry.derived.level_energy`)."""
        power = gpu_series(self.bank, names.POWER_W)
        return level_energy(power, st.window_start, st.window_end, st.output_tps * st.window_s, self.time_scale)

    # ------------------------------------------------------------------ stop
    def stop(self, reason: str | None = None, timeout: float = 30.0) -> list[int]:
        """Abort any ramp (its run is recorded as aborted, with ``reason``), stop telemetry
        and the server. Blocking; returns the pids of the server's group left alive."""
        if self.server_running and self.state not in (State.ATTACHED, State.STOPPING):
            self._set_state(State.STOPPING, "")
        r = self._ramp
        if r is not None and not r.done.is_set():
            self.abort_ramp(reason or "stopped by the user")
            if r.gen is not None:
                r.gen.stop(5.0)
            if r.thread is not None:
                r.thread.join(timeout)
        self._teardown_telemetry()
        for t in list(self._bg):
            t.join(max(0.0, min(timeout, 10.0)))
        sup, left = self.supervisor, []
        if self.rig is not None:
            left = self._close_rig()
            if left:
                log.error("processes of the rig's server parts survived the stop: %s", left)
        if sup is not None:
            left = sup.stop()
            self.last_supervisor, self.supervisor = sup, None
            if left:
                log.error("processes of the server group survived the stop: %s", left)
        attached = self.target is not None and not self.target.engine.launches
        if self.state != State.FAILED:
            self._set_state(State.IDLE if attached or self.target is None else State.STOPPED, "")
        self._ready.set()
        return left
