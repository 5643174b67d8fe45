"""The GUI's handle on one session: server (Supervisor), telemetry and load generator.

Composition only — the work is done by app.server, app.telemetry and app.loadgen.
Every blocking call (launch checks, interpreter probe, stop, generator start/abort)
runs on a background thread (:mod:`widgets.tasks`); the core's callbacks arrive on
the core's own threads and are marshalled to the GUI thread through Qt signals.
Log lines are buffered and pulled by the log pane's timer (never one signal per line).
"""
from __future__ import annotations

import collections
import logging
import gc
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.clock import SessionClock
from app.config import ServerConfig
from app.loadgen.spec import spec_to_wall
from app.loadgen.stats import knee_to_rig, rig_stop_reason, to_rig_time
from app.telemetry.series import SeriesBank
from widgets.live_series import ClientSeries
from widgets.tasks import on_gui_thread, run_in_background

log = logging.getLogger(__name__)

#: states the session reports (the supervisor's, plus idle and attached)
IDLE, ATTACHED = "idle", "attached"
RUNNING_STATES = ("starting", "loading", "ready", "stopping", ATTACHED)


@dataclass
class LaunchRequest:
    """What to start. ``engine``: vllm, sim or attach. ``sim_args``: ``--sim-gpu …``.
    ``python``: vLLM interpreter (None → app.server.interpreter.resolve_python).
    ``attach_url``/``attach_model``: the server to attach to (engine attach)."""

    engine: str
    config: ServerConfig
    sim_args: list[str] = field(default_factory=list)
    python: str | None = None
    attach_url: str | None = None
    attach_model: str | None = None
    use_nvml: bool = True
    gpu_interval: float = 0.25
    metrics_interval: float = 0.5


@dataclass
class RecordRequest:
    """Record the ramp in the run store: ``store_fn()`` returns the RunStore (called off
    the GUI thread; it may open the database), ``profile`` the settings snapshot
    (app.profiles.Profile), ``plan`` the planner's ``plan.as_dict()`` or None."""

    store_fn: Any
    profile: Any
    plan: dict | None = None


class SessionController(QObject):
    """Signals (all delivered on the GUI thread):

    ``state_changed(state, reason)``; ``launch_failed(reason, diagnosis|None)``;
    ``leftovers_found(list[LeftoverProcess], LaunchRequest)`` (launch paused);
    ``stopped(list[int])`` leftover pids after a stop; ``level_started(dict)``;
    ``level_done(StepStats)``; ``ramp_finished(RampResult)`` (``run_id`` set when the
    ramp is recorded); ``run_recorded(int run_id)`` once its run is complete in the run
    store; ``record_failed(str)``; ``safety_stop(str)``.
    """

    state_changed = Signal(str, str)
    launch_failed = Signal(str, object)
    leftovers_found = Signal(object, object)
    stopped = Signal(object)
    ramp_started = Signal(object)
    level_started = Signal(dict)
    level_done = Signal(object)
    ramp_finished = Signal(object)
    safety_stop = Signal(str)
    run_recorded = Signal(int)
    record_failed = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.clock = SessionClock()
        self.bank = SeriesBank()
        self.client = ClientSeries()
        self.state = IDLE
        self.request: LaunchRequest | None = None
        self.supervisor = None
        self.telemetry = None
        self.loadgen = None
        self.ramp_spec = None
        self.url: str | None = None
        self.api_model: str | None = None
        self.safety = None  # app.settings.SafetyLimits
        self.safety_reason: str | None = None
        self.time_scale = 1.0  # sim --sim-time-scale: tables and curves are shown in rig time
        self.recorder = None  # app.recording.RunRecorder of the ramp being recorded
        self._lines: collections.deque[tuple[float, str, str]] = collections.deque(maxlen=50000)
        self._lines_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._safety_timer = QTimer(self)
        self._safety_timer.setInterval(500)
        self._safety_timer.timeout.connect(self._check_safety)

    # ------------------------------------------------------------------ helpers
    def _bg(self, name: str, fn, on_done=None, on_error=None) -> threading.Thread:
        t = run_in_background(name, fn, on_done, on_error)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        return t

    def _set_state(self, state: str, reason: str = "") -> None:
        self.state = state
        self.state_changed.emit(state, reason)

    @property
    def server_running(self) -> bool:
        return self.state in RUNNING_STATES

    @property
    def ready(self) -> bool:
        return self.state in ("ready", ATTACHED)

    @property
    def ramp_running(self) -> bool:
        return self.loadgen is not None

    def take_lines(self) -> list[tuple[float, str, str]]:
        """Log lines ``(t, stream, text)`` received since the last call (GUI timer pulls)."""
        with self._lines_lock:
            out = list(self._lines)
            self._lines.clear()
        return out

    def _push_line(self, stream: str, text: str, t: float) -> None:
        with self._lines_lock:
            self._lines.append((t, stream, text.rstrip("\n")))
        rec = self.recorder
        if rec is not None:
            rec.add_log_line(stream, text.rstrip("\n"), t)

    def _samples(self, samples: list) -> None:
        """Telemetry subscriber (sampler threads): samples of a recorded ramp go to its run."""
        rec = self.recorder
        if rec is not None:
            rec.add_samples(samples)

    # ------------------------------------------------------------------ launch
    def launch(self, req: LaunchRequest, skip_leftover_check: bool = False) -> None:
        """Start the server (or attach). Returns at once; progress comes as signals."""
        if self.server_running:
            raise RuntimeError("a server is already running in this session; stop it first")
        self.request = req
        self.time_scale = 1.0
        if req.engine == "sim" and "--sim-time-scale" in req.sim_args:
            self.time_scale = float(req.sim_args[req.sim_args.index("--sim-time-scale") + 1])
        self.client.time_scale = self.time_scale
        self.bank = SeriesBank()
        self.client.reset()
        self.safety_reason = None
        if req.engine == "attach":
            self._attach(req)
            return
        self._set_state("starting", "checking")

        def work():
            if not skip_leftover_check:
                from app.server.procs import find_leftovers

                left = [p for p in find_leftovers() if p.gpu_bytes]
                if left:
                    return ("leftovers", left)
            from app.server.supervisor import Supervisor

            sup = Supervisor(req.config, engine=req.engine, python=req.python, sim_args=req.sim_args,
                             clock=self.clock, grace=10.0 if req.engine == "sim" else 20.0)
            sup.on_line(self._push_line)
            sup.on_state(lambda ch, sup=sup: self._on_state_thread(sup, ch))
            self.supervisor = sup
            sup.start()  # raises LaunchError for bad input, before starting anything
            return ("started", sup)

        def done(res):
            kind, val = res
            if kind == "leftovers":
                self._set_state(IDLE, "leftover processes hold GPU memory")
                self.leftovers_found.emit(val, req)
                return
            self.url = val.url
            self.api_model = req.config.api_model_name
            if req.engine == "vllm":
                self._start_telemetry(val, req, gpus_now=True)

        def failed(e):
            self.supervisor = None
            self._set_state("failed", str(e))
            self.launch_failed.emit(str(e), None)

        self._bg("launch", work, done, failed)

    def end_leftovers_and_launch(self, pids: list[int], req: LaunchRequest) -> None:
        """End the given leftover processes (background), then launch ``req``."""
        from app.server.procs import end_processes

        self._bg("end-leftovers", lambda: end_processes(pids), lambda _left: self.launch(req, True),
                 lambda e: self.launch_failed.emit(f"could not end leftover processes: {e}", None))

    def _attach(self, req: LaunchRequest) -> None:
        self.url = (req.attach_url or "").rstrip("/")
        self.api_model = req.attach_model or None
        self._start_telemetry(None, req, gpus_now=True)
        self._set_state(ATTACHED, self.url)

    def _on_state_thread(self, sup, ch) -> None:
        """Supervisor thread: diagnose a failure here (pure CPU), then hand over."""
        diag = None
        if ch.state.value == "failed":
            try:
                from app.planner.diagnose import diagnose

                diag = diagnose(sup.log_tail(400), sup.silent_for())
            except Exception:
                log.exception("diagnosis failed")
        on_gui_thread(lambda: self._on_state(sup, ch, diag))

    def _on_state(self, sup, ch, diag) -> None:
        if sup is not self.supervisor:
            return  # a stale supervisor's late news
        state = ch.state.value
        if state == "ready" and self.request is not None:
            self._start_telemetry(sup, self.request, gpus_now=False)
        self._set_state(state, ch.reason)
        if state == "failed":
            self.launch_failed.emit(ch.reason, diag)
            self._teardown_background()

    def _start_telemetry(self, sup, req: LaunchRequest, gpus_now: bool) -> None:
        from app.telemetry.hub import Telemetry

        gpu_source = None
        if req.engine == "sim":
            if sup is None or gpus_now:
                return  # the rig serves its telemetry once it is up
            from app.telemetry.http_source import HttpGpuSource

            gpu_source = HttpGpuSource(sup.url)
        elif req.use_nvml:
            from app.telemetry.nvml_source import NvmlSource

            gpu_source = NvmlSource(req.config.gpus, server_pgid=sup.pgid if sup else None)
        if req.engine == "attach":
            metrics_url = self.url
        elif gpus_now:
            metrics_url = None  # not serving yet: /metrics starts at ready
        else:
            metrics_url = sup.url
        tel = Telemetry(clock=self.clock, gpu_source=gpu_source, metrics_url=metrics_url,
                        pgid=sup.pgid if sup else None, host=sup is not None, bank=self.bank,
                        gpu_interval=req.gpu_interval, metrics_interval=req.metrics_interval)
        if self.telemetry is not None:
            old = self.telemetry
            self._bg("telemetry-stop", old.stop)
        tel.subscribe(self._samples)
        self.telemetry = tel.start()

    # ------------------------------------------------------------------ stop
    def stop(self) -> None:
        """Abort any ramp and stop telemetry and the server (background); ``stopped`` follows."""
        if self.state in (IDLE, "stopped", "failed") and self.supervisor is None and self.telemetry is None:
            return
        if self.server_running and self.state != ATTACHED:
            self._set_state("stopping", "")

        def done(left):
            self.supervisor = None
            if self.state != "failed":
                self._set_state("stopped" if self.request and self.request.engine != "attach" else IDLE, "")
            self.stopped.emit(left)

        self._bg("stop", self._stop_all, done, lambda e: done([]))

    def _stop_all(self) -> list[int]:
        gen, tel, sup = self.loadgen, self.telemetry, self.supervisor
        if gen is not None:
            gen.stop(5.0)
        self.telemetry = None
        if tel is not None:
            tel.stop()
        return sup.stop() if sup is not None else []

    def _teardown_background(self) -> None:
        gen, tel = self.loadgen, self.telemetry
        self.telemetry = None

        def work():
            if gen is not None:
                gen.stop(5.0)
            if tel is not None:
                tel.stop()

        self._bg("teardown", work)

    def shutdown(self, timeout: float = 30.0) -> list[int]:
        """Blocking stop of everything (window close, tests); returns leftover pids."""
        self._safety_timer.stop()
        gen = self.loadgen
        left = self._stop_all()
        self.supervisor = None
        self.loadgen = None
        deadline = time.monotonic() + timeout
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))
        rec, self.recorder = self.recorder, None
        if rec is not None:  # closed mid-ramp: keep what was recorded, marked aborted
            steps = [to_rig_time(st, self.time_scale) for st in gen.result.steps] if gen is not None else []
            try:
                rec.finish("aborted", "the window was closed during the ramp", None, steps)
            except Exception:
                log.exception("could not complete run %s in the run store", rec.run_id)
        return left

    # ------------------------------------------------------------------ ramp
    def run_ramp(self, spec, safety=None, record: RecordRequest | None = None) -> None:
        """Start a ramp (a :class:`app.loadgen.spec.RampSpec` whose url is this server's,
        in rig seconds). ``record``: write the ramp to the run store as a run."""
        from app.loadgen.generator import LoadGenerator

        if self.loadgen is not None:
            raise RuntimeError("a ramp is already running; abort it first")
        # A full (generation-2) collection walks every object of the GUI process — Qt
        # wrappers, pyqtgraph, pydantic models — and stopped the event loop for ≈ 55 ms
        # mid-ramp (benchmarks/gui_stall.py). Collect once now, at the click, and move the
        # survivors to the permanent generation (gc.freeze) so that the ramp's collections
        # only walk what the ramp creates.
        gc.collect()
        gc.freeze()
        self.client.reset()
        self.ramp_spec = spec
        k = self.time_scale
        wall_spec = spec_to_wall(spec, k)
        self.safety = safety
        self.safety_reason = None
        self.recorder = None

        def on_records(recs) -> None:
            self.client.add(recs)
            rec = self.recorder
            if rec is not None:
                rec.add_records(recs)

        def on_level(st) -> None:
            rec = self.recorder
            st = rec.add_level(st) if rec is not None else to_rig_time(st, k)
            on_gui_thread(lambda: self.level_done.emit(st))

        gen = LoadGenerator(wall_spec, clock=self.clock, on_records=on_records,
                            on_level_start=self._on_level_start_thread, on_level=on_level,
                            on_done=lambda res: self._on_done_thread(gen, res))
        self.loadgen = gen
        self.ramp_started.emit(spec)
        if safety is not None and safety.enabled:
            self._safety_timer.start()
        sup = self.supervisor

        def start() -> None:
            if record is not None:
                try:
                    self.recorder = self._open_recorder(record, spec, sup, k)
                except Exception as e:  # the ramp still runs; the user is told it is not recorded
                    log.exception("the run could not be recorded")
                    on_gui_thread(lambda e=e: self.record_failed.emit(f"the ramp is not recorded: {e}"))
            gen.start()

        self._bg("ramp-start", start, None, lambda e: self._on_done_thread(gen, None, e))

    def _open_recorder(self, record: RecordRequest, spec, sup, k: float):
        """Background thread: the run row, hardware fingerprint and the log so far."""
        from app.recording import RunRecorder, hardware_for

        hw = hardware_for(record.profile, sup, self.url)
        return RunRecorder(record.store_fn(), record.profile, spec=spec, clock=self.clock, supervisor=sup,
                           plan=record.plan, hardware=hw, time_scale=k)

    def _on_level_start_thread(self, ev: dict) -> None:
        self.client.level_started(ev.get("t", self.clock.now()), ev.get("level", 0))
        on_gui_thread(lambda: self.level_started.emit(ev))

    def _on_done_thread(self, gen, res, err: BaseException | None = None) -> None:
        self.client.ramp_ended(self.clock.now())

        def finish():
            if gen is not self.loadgen:
                return
            self._bg("ramp-reap", lambda: gen.wait(15), lambda r: self._ramp_over(gen, r))

        on_gui_thread(finish)
        if err is not None:
            gen.result.status, gen.result.error = "error", str(err)
            gen.result.stop_reason = str(err)

    def _ramp_over(self, gen, res) -> None:
        if gen is not self.loadgen:
            return
        self.loadgen = None
        self._safety_timer.stop()
        if self.safety_reason:
            res.status, res.stop_reason = "safety", self.safety_reason
        k = self.time_scale
        res.steps = [to_rig_time(st, k) for st in res.steps]
        res.stop_reason = rig_stop_reason(res.status, res.stop_reason, res.steps)
        res.knee = knee_to_rig(res.knee, k)
        rec, self.recorder = self.recorder, None
        res.run_id = rec.run_id if rec is not None else None
        self.ramp_finished.emit(res)
        if rec is not None:
            status, reason = res.status, res.stop_reason or res.error or ""
            self._bg("ramp-record", lambda: rec.finish(status, reason, res.knee, res.steps),
                     lambda _s: self.run_recorded.emit(rec.run_id),
                     lambda e: self.record_failed.emit(f"run {rec.run_id} could not be completed in the store: {e}"))

    def abort_ramp(self, reason: str | None = None) -> None:
        """Ask the running ramp to stop (completed levels are kept)."""
        gen = self.loadgen
        if gen is None:
            return
        if reason and not self.safety_reason:
            self.safety_reason = reason
        self._bg("ramp-abort", gen.abort)

    def _check_safety(self) -> None:
        """GUI timer: a GPU within the margin of its slowdown temperature stops the ramp."""
        s = self.safety
        if self.loadgen is None or s is None or not s.enabled or self.safety_reason:
            return
        from app.safety import thermal_stop_reason

        reason = thermal_stop_reason(self.bank, s.thermal_margin_c)
        if reason:
            self.abort_ramp(reason)
            self.safety_stop.emit(reason)
