"""The run controller: the only code that sequences a run.

launch (or attach) → ready → telemetry → one or more ramps → record → stop, for every
engine (``vllm``, ``sim``, ``attach``). ``vllm-dyno run`` (:mod:`app.run.profile_run`),
``vllm-dyno ramp`` (attach mode) and the GUI (``widgets.run_adapter``, an adapter turning
the callbacks below into Qt signals) all drive it; the tuner will too. It owns:

- the server and the leftover check: a local one (:class:`app.server.supervisor.Supervisor`),
  an attached URL, or for a profile whose ``hosts:`` name two or more machines a rig of
  them (:class:`app.run.handles.RigHandle`, issue 21); a host lost is a server failure
  naming the host, and the other hosts' parts are ended at once;
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
  ready (:func:`app.planner.diagnose.diagnose`; a ramp that ends badly asks
  :func:`app.run.handles.local_died` or :func:`app.run.handles.attached_failure`);
- recording: it is the only writer to the run store during a run
  (:class:`app.run.record.RunRecorder`): level rows are written once, in rig seconds;
- the outcome of a ramp, its verdict and J/token (assembled in :mod:`app.run.outcome`).

Subscribers: a :class:`RunListener` whose methods are called on the controller's worker
threads (supervisor, load-generator reader, ramp thread) — never block in them.
Blocking methods (:meth:`launch`, :meth:`stop`, :meth:`ramp`) must not be called on a
GUI thread; :meth:`start_ramp` and :meth:`abort_ramp` return at once.
"""
from __future__ import annotations

import functools
import gc
import logging
import threading
import time
from typing import Any, Callable

from app.clock import SessionClock
from app.config import exposure_problem
from app.engines import Engine
from app.hosts.rig import Rig
from app.loadgen.generator import LoadGenerator, RampResult
from app.loadgen.live import ClientSeries
from app.loadgen.prompts import dataset_lengths
from app.loadgen.server_stats import with_notes
from app.loadgen.spec import RampSpec, spec_to_wall
from app.loadgen.capacity import Capacity
from app.loadgen.stats import Knee, StepStats, find_knee, rig_stop_reason, to_rig_time
from app.planner.diagnose import Diagnosis, diagnose
from app.profiles.model import HardwareFingerprint, ResultsSummary
from app.run.hardware import hardware_for, sim_info, time_scale_of
from app.run.launch_timing import LaunchProgress, LaunchTimer
from app.run.handles import RigHandle, attached_failure, local_died, session_telemetry
from app.run.outcome import (OK_STATUSES, RampOutcome, UnsavedRuns, VerdictContext, ramp_energy, ramp_verdict,
                             record_outcome)
from app.run.ramp_state import RampRun
from app.run.record import RecordSpec, RunRecorder, recorder_for
from app.run.target import LaunchTarget, with_cpu_defaults
from app.run.events import RunListener, State
from app.run.safety import CHECK_INTERVAL_S, NoSafety, apply_safety, resolve_safety
from app.run.verdict import Verdict
from app.settings import SafetyLimits
from app.server import procs
from app.server.launch import LaunchError
from app.server.supervisor import StateChange, Supervisor
from app.store import RunStore
from app.telemetry.derived import LevelEnergy
from app.telemetry.hub import Telemetry
from app.telemetry.series import SeriesBank

log = logging.getLogger(__name__)


#: states in which a server is up (or coming up) under this controller
RUNNING_STATES = (State.STARTING, State.LOADING, State.READY, State.STOPPING, State.ATTACHED)


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
        self._ramp: RampRun | None = None
        self._lock = threading.RLock()
        self._ready = threading.Event()
        self._bg: list[threading.Thread] = []
        self._pending = UnsavedRuns(lambda run_id: self._emit("on_run_saved", run_id))
        self.timing = LaunchTimer()  # the launch's key, the earlier launches' phase starts
        #: a multi-host launch (app.run.handles.RigHandle): its agents, plan and parts; kept once
        #: closed, for rig_status()
        self.rig_handle: RigHandle | None = None

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
        self._pending.closing.set()
        if self.unsaved:
            self.save_pending()
        if self._own_store and self._store is not None:
            self._store.close()
            self._store = None
        return left

    # ------------------------------------------------------------------ runs not saved yet
    @property
    def unsaved(self) -> list[RunRecorder]:
        """Finished runs the store could not take yet (a full disk): retried every
        :data:`app.run.outcome.SAVE_RETRY_S` s (:class:`app.run.outcome.UnsavedRuns`)."""
        return self._pending.runs

    def _keep_unsaved(self, rec: RunRecorder, outcome: "RampOutcome | None" = None) -> str:
        """A finished run the store refused (part of): kept and retried; the message for the user."""
        return self._pending.keep(rec, outcome)

    def save_pending(self) -> list[RunRecorder]:
        """Try to write every finished run the store refused so far; each one saved is
        announced (``on_run_saved``). Returns those still unsaved."""
        return self._pending.save()

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
        done, d = with_cpu_defaults(target)
        if d is not None and (d.chosen or d.notes):
            self._emit("on_launch_defaults", d)
        return done

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
            self.rig_handle = None
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
            self.timing.load(lambda: self.store, target.engine, target.config, target.sim_args, target.python)
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
    @property
    def rig(self) -> Rig | None:
        """The launched rig's agents (None: a one-host launch, or the rig is closed)."""
        h = self.rig_handle
        return h.rig if h is not None else None

    def _launch_rig(self, target: LaunchTarget, grace: float) -> None:
        """Start the server of ``target`` over its hosts (:meth:`app.run.handles.RigHandle.launch`);
        the head's ``ready`` makes the controller ready; the URL is the head's API server.
        Raises LaunchError naming the host; the caller closes the rig."""
        h = RigHandle(target.hosts, clock=self.clock, ssh=target.ssh, grace=grace, on_line=self._line,
                      emit=self._emit, on_loading=self._host_loading,
                      on_ready=lambda: self._background("rig-ready", self._rig_ready),  # HTTP, the store: off its loop
                      on_failed=self._host_failed, failure=lambda: self.failure[0] if self.failure else None)
        self.rig_handle = h
        h.launch(target, bank=self.bank if target.telemetry else None, samples=self._samples)
        self.url = h.url
        self.api_model = target.config.api_model_name

    def _host_loading(self, host: str) -> None:
        """The rig's thread: a host's part is loading."""
        if self.state == State.STARTING:
            self._set_state(State.LOADING, f"host {host}")

    def _rig_ready(self) -> None:
        """The head's API server answered: the rig is ready (as :meth:`_on_server_state`
        for one server)."""
        h = self.rig_handle
        if self.rig is None or h is None or self.failure is not None:
            return
        self.url = h.url or self.url
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

    def _host_failed(self, host: str, what: str) -> None:
        """A host of the rig was lost: the run fails naming it, and every other host's
        server part is ended now (off the rig's thread) rather than left to hang."""
        h = self.rig_handle
        if self.rig is None or h is None or h.stopping or self.failure is not None:
            return
        self._fail(f"host {host} was lost: {what}", None)
        self._background("rig-end-parts", lambda: h.stop_parts(exclude=host))

    def _close_rig(self, timeout: float = 60.0) -> list[int]:
        """End every host's server part and close the agents (idempotent); leftovers."""
        h = self.rig_handle
        return h.close(timeout) if h is not None else []

    def rig_status(self) -> list[dict[str, Any]]:
        """The hosts of the launched rig (:meth:`app.run.handles.RigHandle.status`: one
        plain dict each in the profile's order, ``[]`` for a one-host launch; the last
        rig's as it was closed once it is). Safe from any thread."""
        h = self.rig_handle
        return h.status() if h is not None else []

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
        if self.timing.new_phase(self.supervisor):
            p = self.launch_progress()
            if p is not None:
                self._emit("on_launch_phase", p)

    # ------------------------------------------------------------------ launch timing
    @property
    def launch_key(self) -> str | None:
        """The launch's configuration key (:func:`app.run.launch_timing.launch_key`; None before one)."""
        return self.timing.key

    def launch_progress(self) -> LaunchProgress | None:
        """Where the launch is (phase from the log, elapsed s, expected s left after an
        earlier launch of the same configuration); None without a launched server."""
        return self.timing.progress(self.supervisor, self.clock.now())

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
            if self.target is not None:
                self.timing.save(lambda: self.store, self.target.engine, sup, self.clock.now())
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
            return local_died(sup, lambda: self._failed.wait(wait))
        if url is None or self.target is None or self.target.engine.launches:
            return False
        failed = attached_failure(url, records, stop_reason)
        if failed is None:
            return False
        self._fail(*failed)
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
        try:
            tel = session_telemetry(t, sup, clock=self.clock, bank=self.bank, url=self.url, at_ready=at_ready,
                                    sim=bool(self.sim_info), rig=self.rig is not None)
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
        t = self.target
        engine = Engine.SIM if self.sim_info else (t.engine if t else Engine.ATTACH)  # without a profile
        return recorder_for(self.store, record, spec, engine=engine, url=self.url, clock_wall0=self.clock.wall0)

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
                hw = self.rig_handle.hardware(engine, self.sim_info) if self.rig_handle is not None else None
                # each host's part: its config, the argv its agent ran, the CPU build's defaults it filled in
                rec.set_context(hosts=self.rig_handle.part_records() if self.rig_handle is not None else [])
            else:
                hw = hardware_for(engine, supervisor=sup, info=self.sim_info,
                                  gpus=t.config.gpus if t is not None else None)
            self.hardware = hw
            rec.set_context(hardware=hw, time_scale=self.time_scale, model=self.api_model)
            if hw is not None and (engine.simulated or self.rig is not None):
                rec.gpu_count = hw.count
        except Exception:
            log.exception("could not record the server of run %s", rec.run_id)

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
            r = RampRun(apply_safety(spec, limits), record, limits)
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

    def _ramp_main(self, r: RampRun) -> None:
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
        if r.recorder is not None:
            record_outcome(r.recorder, out, r.record, self._pending, self._emit)
        elif self.run is not None:
            out.run_id = self.run.run_id
        r.outcome = out
        r.done.set()
        self._emit("on_ramp_done", out)

    def _check_safety(self, r: RampRun) -> None:
        """Ramp thread, every CHECK_INTERVAL_S: thermal limit, a failed server."""
        reason = r.check_safety(self.bank, self.failure is not None)
        if reason:
            self._emit("on_safety_stop", reason)

    def _outcome(self, r: RampRun, res: RampResult, k: float) -> RampOutcome:
        """The generator's result → the ramp's outcome in rig seconds."""
        with r.lock:
            steps = list(r.steps)
        status, reason = res.status, res.stop_reason or (res.error or "")
        if r.safety_reason:
            status, reason = "safety", r.safety_reason
        elif r.ended_by_server(res, status, self.failure is not None) and self._server_died(list(res.records), reason):
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

    def _verdict(self, r: RampRun, steps: list[StepStats], records: list,
                 served: str | None = None) -> tuple[Capacity, Verdict]:
        """Users at the SLO and the verdict of a ramp's levels (:func:`app.run.outcome.ramp_verdict`)."""
        plan = r.record.plan if r.record is not None else (self.run.plan if self.run is not None else None)
        return ramp_verdict(r.spec, steps, records, VerdictContext(
            target=self.target, time_scale=self.time_scale, sim_info=self.sim_info, hardware=self.hardware,
            supervisor=self.supervisor, url=self.url, api_model=self.api_model, bank=self.bank, plan=plan),
            served=served)

    # ------------------------------------------------------------------ energy
    def energy(self, st: StepStats) -> LevelEnergy:
        """Power (W) and J/token of level ``st`` (rig seconds) from the live GPU power
        samples (:func:`app.run.outcome.ramp_energy`)."""
        return ramp_energy(self.bank, st, self.time_scale)

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
