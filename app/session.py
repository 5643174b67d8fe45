"""One run of a profile: plan → launch → ready → ramp → record → stop.

:class:`Session` is what ``vllm-dyno run PROFILE`` and the GUI both drive. It is
Qt-free: subscribers are plain callables called on the session's worker threads
(``on_phase(phase, message)``, ``on_line(stream, text, t)``, ``on_level_start(dict)``,
``on_level(StepStats)``, ``on_records(list[RequestRecord])``); the live telemetry is
in ``session.telemetry.bank`` (a SeriesBank) once the server is ready.

Everything a run produces goes to the run store (:class:`app.store.RunStore`): the
profile snapshot and launch config (``runs.config``), the ramp spec, the plan
(``plan.as_dict()``), the log-parsed capacity facts, the per-level stats and every
request, the telemetry samples and the server's full log; ``runs.summary`` holds the
outcome, the hardware fingerprint and the results summary (a
:class:`~app.profiles.ResultsSummary` dump under ``results``).

Sim time (shared/DESIGN.md): a sim started with ``--sim-time-scale k`` runs k× faster
than the wall clock and says so at ``/sim/info``; the session then stores level
statistics in rig seconds (latencies × k, rates ÷ k). Requests and samples stay in
wall seconds on the session clock; ``summary.time_scale`` records k.
"""
from __future__ import annotations

import enum
import json
import logging
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable

from app.clock import SessionClock
from app.loadgen.spec import spec_to_wall
from app.loadgen.stats import Knee, StepStats, rig_stop_reason, to_rig_time
from app.profiles.model import HardwareFingerprint, Profile, ResultsSummary
from app.recording import run_summary, sim_hardware

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
class SessionResult:
    """The outcome. ``status``: the ramp's (``done``, ``slo_broken``, ``failed``,
    ``stopped``, ``aborted``, ``error``) or ``launch_failed`` / ``plan_error`` /
    ``server_failed``; ``reason``: one line for humans; ``run_id``: the recorded run
    (None when nothing was recorded, i.e. ``plan_error``)."""

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

    @property
    def ok(self) -> bool:
        """True when the ramp ran to an orderly end (all levels or an SLO stop)."""
        return self.status in ("done", "slo_broken", "stopped")


def plan_profile(profile: Profile, vllm_version: str | None = None):
    """The planner's :class:`~app.planner.plan.Plan` of ``profile`` on its own
    ``hardware`` (the rig for engine sim), for the ramp's request shape. Returns None
    when the profile names no hardware. Raises the planner's errors
    (ModelNotFoundError, UnknownGpuError, ValueError)."""
    from app.planner.models import resolve_model
    from app.planner.plan import Workload, plan

    hw = profile.hardware
    if profile.engine == "sim" and profile.sim is not None:
        hw = HardwareFingerprint(gpu=profile.sim.gpu, count=profile.sim.count)
    if hw is None:
        return None
    cfg = profile.server_config()
    r = profile.ramp

    def hi(x):
        return x[1] if isinstance(x, tuple) else x

    levels = tuple(int(x) for x in r.levels) if r.mode == "concurrency" and r.levels else None
    wl = Workload(prompt_tokens=hi(r.prompt_tokens), output_tokens=hi(r.output_tokens), levels=levels)
    return plan(cfg, hw.planner_cards(), resolve_model(cfg.model), wl, vllm_version=vllm_version)


def _get_json(url: str, timeout: float = 3.0) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read().decode())
    except (OSError, ValueError):
        return None


def local_hardware(indices: list[int] | None, vllm_version: str | None, cpu_build: bool) -> HardwareFingerprint:
    """The fingerprint of this machine: NVML card names, count, memory and driver for the
    selected ``indices`` (all when None); ``CPU`` with the host memory for the CPU build
    of vLLM or when NVML is not available."""
    if not cpu_build:
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                drv = pynvml.nvmlSystemGetDriverVersion()
                drv = drv.decode() if isinstance(drv, bytes) else str(drv)
                n = pynvml.nvmlDeviceGetCount()
                idx = indices if indices is not None else list(range(n))
                names, mem = [], []
                for i in idx:
                    h = pynvml.nvmlDeviceGetHandleByIndex(i)
                    nm = pynvml.nvmlDeviceGetName(h)
                    names.append(nm.decode() if isinstance(nm, bytes) else str(nm))
                    mem.append(pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30)
            finally:
                pynvml.nvmlShutdown()
            if names:
                uniq = list(dict.fromkeys(names))
                return HardwareFingerprint(gpu=" + ".join(uniq), count=len(names), memory_gib=round(min(mem), 2),
                                           driver=drv, vllm_version=vllm_version, recorded_at=time.time())
        except Exception as e:  # no driver / library: fall through to the CPU description
            log.debug("NVML not available for the fingerprint: %s", e)
    import psutil

    return HardwareFingerprint(gpu="CPU", count=1, memory_gib=round(psutil.virtual_memory().total / 2**30, 1),
                               vllm_version=vllm_version, recorded_at=time.time())


class Session:
    """One run of ``profile``.

    ``store``: a RunStore (None → the default one, opened and closed by the session).
    ``python``: the vLLM interpreter (engine vllm). ``ramp_overrides``: RampSpec fields
    to change for this run (e.g. ``{"levels": [1, 2], "step_seconds": 5}``).
    ``force``: launch even when the planner's verdict is ``error``. ``telemetry``:
    sample GPUs (NVML or the sim rig), host and ``/metrics``. ``startup_timeout`` and
    ``grace`` in seconds (see app.server.supervisor). :meth:`run` blocks; call
    :meth:`abort` from another thread to stop early (what was recorded is kept).
    """

    def __init__(self, profile: Profile, *, store=None, python: str | None = None, clock: SessionClock | None = None,
                 ramp_overrides: dict[str, Any] | None = None, force: bool = False, telemetry: bool = True,
                 use_planner: bool = True, startup_timeout: float = 900.0, grace: float = 20.0,
                 bank=None, on_phase: Callable[[Phase, str], None] | None = None,
                 on_line: Callable[[str, str, float], None] | None = None,
                 on_level_start: Callable[[dict], None] | None = None,
                 on_level: Callable[[StepStats], None] | None = None,
                 on_records: Callable[[list], None] | None = None) -> None:
        self.profile = profile
        self._own_store = store is None
        self.store = store
        self.python = python
        self.clock = clock or SessionClock()
        self.ramp_overrides = dict(ramp_overrides or {})
        self.force = force
        self.use_telemetry = telemetry
        self.use_planner = use_planner
        self.startup_timeout = startup_timeout
        self.grace = grace
        self.bank = bank
        self.on_phase, self.on_line, self.on_level_start = on_phase, on_line, on_level_start
        self.on_level, self.on_records = on_level, on_records
        self.phase = Phase.PLANNING
        self.supervisor = None
        self.telemetry = None
        self.generator = None
        self.run_id: int | None = None
        self.url: str | None = None
        self.plan = None
        self.time_scale = 1.0
        self._abort = threading.Event()
        self._steps: list[StepStats] = []

    # ------------------------------------------------------------------ control
    def abort(self) -> None:
        """Stop the run as soon as possible (thread-safe, idempotent)."""
        self._abort.set()
        gen = self.generator
        if gen is not None:
            gen.abort()

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

    # ------------------------------------------------------------------ steps
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

    def run(self) -> SessionResult:
        """Plan, launch, wait for ready, ramp, record, stop. Never leaves a process
        running; returns the :class:`SessionResult` (errors become its status)."""
        if self.store is None:
            from app.store import RunStore

            self.store = RunStore()
        try:
            return self._run()
        finally:
            if self._own_store and self.store is not None:
                self.store.close()

    def _run(self) -> SessionResult:
        prof = self.profile
        self._set_phase(Phase.PLANNING)
        plan = self.make_plan()
        if plan is not None and plan.get("verdict") == "error" and not self.force:
            msg = "; ".join(f["message"] for f in plan.get("findings", []) if f["verdict"] == "error")
            self._set_phase(Phase.FAILED, msg)
            return SessionResult("plan_error", f"the planner says this cannot work: {msg} "
                                               "(fix the profile, or run with force)", plan=plan)
        cfg = prof.server_config()
        self.run_id = self.store.create_run(
            prof.name, prof.engine, config={"profile": prof.to_data()},
            spec=prof.ramp.model_dump(mode="json"), plan=plan, clock_wall0=self.clock.wall0)
        res = SessionResult("error", run_id=self.run_id, plan=plan)
        try:
            self._launch_and_ramp(cfg, res)
        except Exception as e:  # an unexpected failure still stops everything and is recorded
            log.exception("session failed")
            res.status, res.reason = "error", f"{type(e).__name__}: {e}"
        finally:
            self._stop_all()
        res.steps = list(self._steps)
        res.time_scale = self.time_scale
        if self.supervisor is not None and self.supervisor.failure is not None and res.status not in (
                "launch_failed", "server_failed"):
            if not res.ok:
                res.status, res.reason = "server_failed", self.supervisor.failure.reason
        if self.aborted and res.status not in ("launch_failed",):
            res.status, res.reason = "aborted", res.reason or "aborted by the user"
        summary, res.results = run_summary(res.status, res.reason, res.steps, res.knee, run_id=self.run_id,
                                           gpu_count=cfg.world_size, time_scale=self.time_scale,
                                           hardware=res.hardware)
        self.store.finish_run(self.run_id, res.status, summary=summary, capacity=res.capacity)
        self.store.flush()
        final = Phase.DONE if res.ok else (Phase.ABORTED if res.status == "aborted" else Phase.FAILED)
        self._set_phase(final, res.reason)
        return res

    def _launch_and_ramp(self, cfg, res: SessionResult) -> None:
        from app.loadgen.generator import LoadGenerator
        from app.server.launch import LaunchError
        from app.server.supervisor import Supervisor

        prof = self.profile
        vllm_version = None
        cpu_build = False
        if prof.engine == "attach":
            self.url = prof.attach_url.rstrip("/")
            model = None
        else:
            self._set_phase(Phase.LAUNCHING)
            sup = Supervisor(cfg, engine=prof.engine, python=self.python,
                             sim_args=prof.sim.argv() if prof.engine == "sim" and prof.sim else [],
                             startup_timeout=self.startup_timeout, grace=self.grace, clock=self.clock)
            self.supervisor = sup
            sup.on_line(self._line)
            sup.on_state(lambda ch: self._set_phase(Phase.LOADING) if ch.state.value == "loading" else None)
            try:
                sup.start()
            except LaunchError as e:
                res.status, res.reason = "launch_failed", str(e)
                return
            while not sup.wait_ready(0.5):
                if self.aborted or sup.state.value in ("failed", "stopped"):
                    break
            if sup.state.value != "ready":
                if not self.aborted:
                    f = sup.failure
                    res.status, res.reason = "launch_failed", f.reason if f else f"server {sup.state.value}"
                res.capacity = sup.parser.facts.as_dict()
                return
            self.url = sup.url
            model = sup.config.api_model_name
            res.capacity = sup.parser.facts.as_dict()
            self.store.update_run(self.run_id, capacity=res.capacity,
                                  config={"profile": prof.to_data(), "server": sup.config.model_dump(mode="json"),
                                          "argv": sup.argv})
            if sup.interpreter is not None:
                vllm_version = sup.interpreter.version
                cpu_build = sup.interpreter.is_cpu_build
            vllm_version = sup.parser.facts.version or vllm_version
        self._set_phase(Phase.READY, self.url)
        # hardware fingerprint and sim time scale
        if prof.engine == "sim":
            info = _get_json(self.url + "/sim/info") or {}
            self.time_scale = float(info.get("time_scale") or 1.0)
            res.hardware = sim_hardware(prof, info)
        elif prof.engine == "vllm":
            res.hardware = local_hardware(cfg.gpus, vllm_version, cpu_build)
        if self.use_telemetry:
            self._start_telemetry(cfg)
        # the ramp
        if self.aborted:
            return
        self._set_phase(Phase.RAMPING)
        spec = prof.ramp_spec(self.url, model, **self.ramp_overrides)
        self.store.update_run(self.run_id, spec=spec)
        api_key = cfg.env.get("VLLM_API_KEY")
        # SLO bounds are rig seconds; the durations of a headless run stay wall seconds
        gen = LoadGenerator(spec_to_wall(spec, self.time_scale, durations=False), clock=self.clock, store=self.store, run_id=self.run_id, api_key=api_key,
                            on_records=self.on_records, on_level_start=self.on_level_start, on_level=self._level)
        self.generator = gen
        gen.start()
        if self.aborted:
            gen.abort()
        while gen.running:
            gen.wait(0.5)
            if self.supervisor is not None and self.supervisor.state.value == "failed":
                gen.abort()
        r = gen.wait()
        res.knee = r.knee
        res.status, res.reason = r.status, r.stop_reason or (r.error or "")
        res.reason = rig_stop_reason(res.status, res.reason, self._steps)
        if self.time_scale != 1.0 and self._steps:
            from app.loadgen.stats import find_knee

            res.knee = find_knee(self._steps, spec.knee_gain, spec.knee_ttft_ratio)

    def _line(self, stream: str, text: str, t: float) -> None:
        if self.run_id is not None:
            self.store.add_log_lines(self.run_id, [(t, stream, text)])
        if self.on_line is not None:
            self.on_line(stream, text, t)

    def _level(self, st: StepStats) -> None:
        st = to_rig_time(st, self.time_scale)
        if self.time_scale != 1.0:
            self.store.add_level(self.run_id, st)  # replaces the wall-time row the generator wrote
        self._steps.append(st)
        if self.on_level is not None:
            self.on_level(st)

    def _start_telemetry(self, cfg) -> None:
        try:
            from app.telemetry.hub import Telemetry, default_gpu_source

            sim_url = self.url if self.profile.engine == "sim" else None
            sup = self.supervisor
            src = None
            if self.profile.engine != "attach":
                cpu = sup is not None and sup.interpreter is not None and sup.interpreter.is_cpu_build
                src = None if cpu else default_gpu_source(cfg.gpus, sim_url, sup.pgid if sup else None)
            self.telemetry = Telemetry(clock=self.clock, gpu_source=src, metrics_url=self.url,
                                       pgid=sup.pgid if sup else None, store=self.store, run_id=self.run_id,
                                       bank=self.bank)
            self.telemetry.start()
        except Exception:
            log.exception("telemetry could not start; the run goes on without it")
            self.telemetry = None

    def _stop_all(self) -> None:
        self._set_phase(Phase.STOPPING)
        if self.generator is not None:
            try:
                self.generator.stop()
            except Exception:
                log.exception("stopping the load generator failed")
        if self.telemetry is not None:
            try:
                self.telemetry.stop()
            except Exception:
                log.exception("stopping telemetry failed")
        if self.supervisor is not None:
            left = self.supervisor.stop()
            if left:
                log.error("processes of the server group survived the stop: %s", left)
