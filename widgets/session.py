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
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from app.clock import SessionClock
from app.config import ServerConfig
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


_RATES = ("output_tps", "total_tps", "rps", "goodput_rps")
_LATENCIES = tuple(f"{m}_{q}" for m in ("ttft", "tpot", "itl", "e2e") for q in ("p50", "p90", "p99", "max", "mean"))


def stats_to_rig(st, k: float):
    """StepStats measured on the wall clock → rig time for a sim running ``k``× faster
    (shared/DESIGN.md, "Sim time"): rates ÷ k, latencies × k. ``k == 1`` returns ``st``."""
    if k == 1:
        return st
    upd = {f: getattr(st, f) / k for f in _RATES}
    upd.update({f: getattr(st, f) * k for f in _LATENCIES if getattr(st, f, None) is not None})
    return st.model_copy(update=upd)


def knee_to_rig(knee, k: float):
    if knee is None or k == 1:
        return knee
    return knee.model_copy(update={"output_tps": knee.output_tps / k, "next_output_tps": knee.next_output_tps / k,
                                   "ttft_p99": knee.ttft_p99 * k, "next_ttft_p99": knee.next_ttft_p99 * k})


def spec_to_wall(spec, k: float):
    """A RampSpec written in rig seconds → wall seconds for a sim running ``k``× faster."""
    if k == 1:
        return spec
    slo = spec.slo.model_copy(update={f: getattr(spec.slo, f) / k for f in ("ttft_p99", "tpot_p99", "e2e_p99")
                                      if getattr(spec.slo, f) is not None})
    upd = {"slo": slo, "warmup_seconds": spec.warmup_seconds / k, "request_timeout": spec.request_timeout / k}
    if spec.step_seconds is not None:
        upd["step_seconds"] = spec.step_seconds / k
    if spec.max_total_seconds is not None:
        upd["max_total_seconds"] = spec.max_total_seconds / k
    return spec.model_copy(update=upd)


class SessionController(QObject):
    """Signals (all delivered on the GUI thread):

    ``state_changed(state, reason)``; ``launch_failed(reason, diagnosis|None)``;
    ``leftovers_found(list[LeftoverProcess], LaunchRequest)`` (launch paused);
    ``stopped(list[int])`` leftover pids after a stop; ``level_started(dict)``;
    ``level_done(StepStats)``; ``ramp_finished(RampResult)``; ``safety_stop(str)``.
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
        left = self._stop_all()
        self.supervisor = None
        self.loadgen = None
        deadline = time.monotonic() + timeout
        for t in list(self._threads):
            t.join(max(0.0, deadline - time.monotonic()))
        return left

    # ------------------------------------------------------------------ ramp
    def run_ramp(self, spec, safety=None) -> None:
        """Start a ramp (a :class:`app.loadgen.spec.RampSpec` whose url is this server's)."""
        from app.loadgen.generator import LoadGenerator

        if self.loadgen is not None:
            raise RuntimeError("a ramp is already running; abort it first")
        self.client.reset()
        self.ramp_spec = spec
        k = self.time_scale
        wall_spec = spec_to_wall(spec, k)
        self.safety = safety
        self.safety_reason = None
        gen = LoadGenerator(wall_spec, clock=self.clock, on_records=self.client.add,
                            on_level_start=self._on_level_start_thread,
                            on_level=lambda st: on_gui_thread(lambda: self.level_done.emit(stats_to_rig(st, k))),
                            on_done=lambda res: self._on_done_thread(gen, res))
        self.loadgen = gen
        self.ramp_started.emit(spec)
        if safety is not None and safety.enabled:
            self._safety_timer.start()
        self._bg("ramp-start", gen.start, None, lambda e: self._on_done_thread(gen, None, e))

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
        res.steps = [stats_to_rig(st, k) for st in res.steps]
        res.knee = knee_to_rig(res.knee, k)
        self.ramp_finished.emit(res)

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
        for src, name in self.bank.keys():
            if name != "temp_gpu_c":
                continue
            cur, slow = self.bank.last(src, name), self.bank.last(src, "temp_slowdown_c")
            if cur is None or slow is None or cur[1] != cur[1] or slow[1] != slow[1]:
                continue
            if cur[1] >= slow[1] - s.thermal_margin_c:
                reason = (f"safety stop: {src.replace('gpu', 'GPU ')} reached {cur[1]:.0f} °C, within "
                          f"{s.thermal_margin_c:g} °C of its slowdown temperature {slow[1]:.0f} °C")
                self.abort_ramp(reason)
                self.safety_stop.emit(reason)
                return
