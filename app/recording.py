"""Recording a ramp into the run store — shared by the headless session and the GUI.

:func:`run_summary` builds the ``runs.summary`` mapping (status, knee, peak, GPUs, time
scale, hardware fingerprint, :class:`~app.profiles.ResultsSummary`) that
:class:`app.session.Session` writes and ``vllm-dyno runs list`` / app.history /
app.compare read. :class:`RunRecorder` records one ramp against a server that is
already up (the GUI launches once and ramps many times: one run per ramp) — the same
rows a headless session writes: the run (profile snapshot and launch config, ramp spec,
plan, log-parsed capacity facts), the per-level stats in rig seconds, every request,
the telemetry samples and the server's log.

Times: requests, samples and log lines are session-clock seconds (wall); level stats
are stored in rig seconds for a sim running ``time_scale``× faster than the wall clock
(:func:`app.loadgen.stats.to_rig_time`), as the session does.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Iterable

from app.loadgen.stats import Knee, StepStats, to_rig_time
from app.profiles.model import HardwareFingerprint, Profile, ResultsSummary

log = logging.getLogger(__name__)


def run_summary(status: str, reason: str, steps: list[StepStats], knee: Knee | None, *, run_id: int | None,
                gpu_count: int, time_scale: float = 1.0,
                hardware: HardwareFingerprint | None = None) -> tuple[dict[str, Any], ResultsSummary | None]:
    """The ``runs.summary`` mapping of a finished ramp and its results summary (None when
    no level completed). ``steps`` in rig seconds; ``gpu_count``: cards the server used."""
    results = None
    if steps:
        results = ResultsSummary.from_levels([s.model_dump() for s in steps], run_id=run_id, status=status,
                                             knee=knee.level if knee else None)
    summary = {"status": status, "stop_reason": reason, "knee": knee.model_dump() if knee else None,
               "peak_output_tps": results.peak_output_tps if results else None,
               "peak_level": results.best_level if results else None,
               "gpu_count": gpu_count, "time_scale": time_scale,
               "hardware": hardware.model_dump() if hardware else None,
               "results": results.model_dump(mode="json") if results else None}
    return summary, results


def sim_hardware(profile: Profile | None, sim_info: dict[str, Any] | None = None) -> HardwareFingerprint:
    """The fingerprint of a simulated rig: ``profile.sim``, else the rig its ``/sim/info``
    (``sim_info``) names (``gpu``, ``gpu_count``; a run of ``vllm-dyno ramp`` has no profile)."""
    info = sim_info or {}
    rig = profile.sim if profile is not None else None
    gpu = rig.gpu if rig else str(info.get("gpu") or "RTX 4090")
    count = rig.count if rig else int(info.get("gpu_count") or 1)
    ver = info.get("vllm_version", "")
    return HardwareFingerprint(gpu=gpu, count=count, vllm_version=f"sim {ver}".strip(), recorded_at=time.time())


class RunRecorder:
    """One ramp's run in ``store`` (a :class:`app.store.RunStore`).

    ``profile``: the settings snapshot (``runs.config.profile``); ``supervisor``: the
    :class:`app.server.supervisor.Supervisor` of the running server (None when attached)
    — its launch config, argv, log-parsed capacity facts and log so far are recorded.
    ``spec``: the RampSpec as the user wrote it (rig seconds); ``plan``: the planner's
    ``plan.as_dict()`` or None; ``hardware``: the fingerprint (see :func:`hardware_for`);
    ``time_scale``: the sim's k. The run row is created here (status ``running``).

    Feed it from any thread: :meth:`add_log_line` (a supervisor line subscriber),
    :meth:`add_samples` (a telemetry subscriber), :meth:`add_records` (the generator's
    ``on_records``), :meth:`add_level` (its ``on_level``; returns the rig-time stats);
    then :meth:`finish`. After :meth:`finish` the feeds are ignored.
    """

    def __init__(self, store, profile: Profile, *, spec: Any, clock, supervisor=None, plan: dict | None = None,
                 hardware: HardwareFingerprint | None = None, time_scale: float = 1.0) -> None:
        from app.telemetry.recorder import StoreWriter

        self.store = store
        self.profile = profile
        self.time_scale = float(time_scale or 1.0)
        self.hardware = hardware
        self.supervisor = supervisor
        config: dict[str, Any] = {"profile": profile.to_data()}
        capacity = None
        self.gpu_count = 1
        if supervisor is not None:
            config["server"] = supervisor.config.model_dump(mode="json")
            config["argv"] = list(supervisor.argv)
            capacity = supervisor.parser.facts.as_dict()
            self.gpu_count = supervisor.config.world_size
        else:
            try:
                self.gpu_count = profile.server_config(resolve=False).world_size
            except Exception:
                self.gpu_count = 1
        self.run_id: int = store.create_run(profile.name, profile.engine, config=config, spec=spec, plan=plan,
                                            capacity=capacity, clock_wall0=clock.wall0)
        self.steps: list[StepStats] = []
        self._lock = threading.Lock()
        self._open = True
        self._writer = StoreWriter(store, self.run_id)
        self._log_after = float("-inf")
        if supervisor is not None:
            lines = list(supervisor.lines.copy())  # deque.copy runs under the GIL: a consistent snapshot
            if lines:
                store.add_log_lines(self.run_id, lines)
                self._log_after = lines[-1][0]

    @property
    def open(self) -> bool:
        return self._open

    # ------------------------------------------------------------------ feeds
    def add_log_line(self, stream: str, text: str, t: float) -> None:
        """A server log line (the supervisor's ``on_line`` signature)."""
        if self._open and t > self._log_after:
            self.store.add_log_lines(self.run_id, [(t, stream, text)])

    def add_samples(self, samples: list) -> None:
        """Telemetry samples ``(t, source, name, value)`` (a sampler subscriber)."""
        if self._open:
            self._writer(samples)

    def add_records(self, records: Iterable[Any]) -> None:
        """Request records (:class:`app.loadgen.records.RequestRecord`)."""
        if self._open:
            self.store.add_requests(self.run_id, records)

    def add_level(self, st: StepStats) -> StepStats:
        """Store one level (converted to rig seconds) and return the stored stats."""
        st = to_rig_time(st, self.time_scale)
        with self._lock:
            self.steps = [s for s in self.steps if s.idx != st.idx] + [st]
            self.steps.sort(key=lambda s: s.idx)
        if self._open:
            self.store.add_level(self.run_id, st)
        return st

    # ------------------------------------------------------------------ end
    def finish(self, status: str, reason: str = "", knee: Knee | None = None,
               steps: list[StepStats] | None = None) -> tuple[dict[str, Any], ResultsSummary | None]:
        """Close the run: remaining levels (``steps``, rig seconds) stored, telemetry
        flushed, the capacity facts refreshed, the summary written. Idempotent: a second
        call returns the first summary."""
        with self._lock:
            if not self._open:
                return self._summary
            self._open = False
        for st in steps or []:
            if all(s.idx != st.idx for s in self.steps):
                self.steps.append(st)
                self.store.add_level(self.run_id, st)
        self.steps.sort(key=lambda s: s.idx)
        self._writer.close()
        capacity = self.supervisor.parser.facts.as_dict() if self.supervisor is not None else None
        self._summary = run_summary(status, reason, self.steps, knee, run_id=self.run_id, gpu_count=self.gpu_count,
                                    time_scale=self.time_scale, hardware=self.hardware)
        self.store.finish_run(self.run_id, status, summary=self._summary[0], capacity=capacity)
        self.store.flush()
        return self._summary


def hardware_for(profile: Profile, supervisor=None, url: str | None = None) -> HardwareFingerprint | None:
    """The hardware fingerprint of a run of ``profile``: the rig for engine sim (asks
    ``url``/sim/info), this machine's cards (NVML) or ``CPU`` for engine vllm, None for
    attach (the cards behind a URL are unknown). Blocking (HTTP, NVML): call it off the
    GUI thread."""
    if profile.engine == "sim":
        from app.session import _get_json

        return sim_hardware(profile, _get_json(url.rstrip("/") + "/sim/info") if url else None)
    if profile.engine == "vllm":
        from app.session import local_hardware

        version, cpu = None, False
        if supervisor is not None:
            if supervisor.interpreter is not None:
                version, cpu = supervisor.interpreter.version, supervisor.interpreter.is_cpu_build
            version = supervisor.parser.facts.version or version
        gpus = supervisor.config.gpus if supervisor is not None else profile.gpu_indices()
        return local_hardware(gpus, version, cpu)
    return None
