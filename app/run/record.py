"""Recording a run into the run store: the one writer of ``runs.sqlite`` during a run.

:class:`RunRecorder` is owned by :class:`app.run.controller.RunController`: the load
generator, the telemetry samplers and the supervisor only report; the controller feeds
what they report to the recorder of the run that is open. One run = one ramp (the GUI
launches once and ramps many times), or a whole headless ``vllm-dyno run`` (its run is
opened before the launch, so a failed launch is recorded too).

Rows of a run: the run (name, engine, profile snapshot and launch config under
``config``, the ramp spec, the plan, the log-parsed capacity facts), the per-level stats
(written once, in rig seconds), every request, the telemetry samples and the server's
log; ``runs.summary`` is :func:`run_summary`.

Secrets are never stored (issue 15, item 3): the launch config's secret-named
environment values and secret options in argv are redacted
(:func:`app.config.redact_secrets`, :func:`app.config.redact_argv`), the profile
snapshot loses its secret-named ``env`` keys, and a log line or stop reason that echoes a
secret value (the server's or this process's secret-named variables) has it replaced by
``<redacted>`` (:func:`app.config.redact_text`).

Times: requests, samples and log lines are session-clock seconds (wall); level stats are
in rig seconds for a sim running ``time_scale``× faster than the wall clock
(:func:`app.loadgen.stats.to_rig_time`; docs/design.md, "Sim time").
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Iterable

from app.config import redact_argv, redact_secrets, redact_text, secret_values
from app.loadgen.stats import Knee, StepStats, peak_level
from app.profiles.model import HardwareFingerprint, ResultsSummary
from app.telemetry.store_writer import StoreWriter

log = logging.getLogger(__name__)


def run_summary(status: str, reason: str, steps: list[StepStats], knee: Knee | None, *, run_id: int | None,
                gpu_count: int, time_scale: float = 1.0, hardware: HardwareFingerprint | None = None,
                model: str | None = None, requests_by_status: dict[str, int] | None = None,
                error: str | None = None, verdict: Any = None,
                users_at_slo: Any = None) -> tuple[dict[str, Any], ResultsSummary | None]:
    """The ``runs.summary`` mapping of a finished run and its results summary (None when
    no level completed). ``steps`` in rig seconds; ``gpu_count``: cards the server used.

    Keys: ``status``, ``stop_reason``, ``error``, ``model``, ``knee`` (Knee dump) and
    ``knee_text``, ``peak_output_tps``/``peak_level`` (the best level that met the SLO and
    failed < 50 % of its requests: :func:`app.loadgen.stats.peak_level`, the one
    definition of "peak"), ``gpu_count``, ``time_scale``, ``hardware``, ``requests`` and
    ``requests_by_status``, ``results`` (a :class:`ResultsSummary` dump), ``verdict`` (an
    :class:`app.run.verdict.Verdict` dump: the one-sentence answer) and ``users_at_slo``
    (an :class:`app.loadgen.capacity.Capacity` dump), None when not computed."""
    results = None
    if steps:
        results = ResultsSummary.from_levels([s.model_dump() for s in steps], run_id=run_id, status=status,
                                             knee=knee.level if knee else None)
        if verdict is not None:
            results.users_at_slo = verdict.users
            results.verdict = verdict.sentence
    best = peak_level(steps)
    by_status = dict(requests_by_status or {})
    summary = {"status": status, "stop_reason": reason, "error": error, "model": model,
               "knee": knee.model_dump() if knee else None, "knee_text": knee.describe() if knee else None,
               "peak_output_tps": best.output_tps if best else None,
               "peak_level": best.level if best else None,
               "gpu_count": gpu_count, "time_scale": time_scale,
               "hardware": hardware.model_dump() if hardware else None,
               "requests": sum(by_status.values()), "requests_by_status": by_status,
               "results": results.model_dump(mode="json") if results else None,
               "verdict": verdict.model_dump(mode="json") if verdict is not None else None,
               "users_at_slo": users_at_slo.model_dump(mode="json") if users_at_slo is not None else None}
    return summary, results


class RunRecorder:
    """One run in ``store`` (a :class:`app.store.RunStore`); the run row is created here
    (status ``running``).

    ``name``/``engine``: the run's name and engine (vllm, sim, attach); ``profile_data``:
    the settings snapshot (``Profile.to_data()``, or None for ``vllm-dyno ramp``);
    ``spec``: the RampSpec as the user wrote it (rig seconds) or None until the ramp
    starts; ``plan``: the planner's ``plan.as_dict()`` or None; ``gpu_count``: cards the
    server uses; ``clock_wall0``: the session clock's wall time at t = 0.

    Feed it from any thread: :meth:`attach_server` (once the server is known),
    :meth:`set_context` (spec, hardware, time scale), :meth:`add_log_line`,
    :meth:`add_samples`, :meth:`add_records`, :meth:`add_level` (rig-time stats); then
    :meth:`finish`. After :meth:`finish` the feeds are ignored.
    """

    def __init__(self, store, *, name: str, engine: str, profile_data: dict | None, spec: Any = None,
                 plan: dict | None = None, gpu_count: int = 1, clock_wall0: float | None = None) -> None:
        self.store = store
        self.engine = engine
        self.time_scale = 1.0
        self.hardware: HardwareFingerprint | None = None
        self.supervisor = None
        self.gpu_count = gpu_count
        self.model: str | None = None
        #: secret values that must not reach the store (this process's secret-named variables; the
        #: server's are added by attach_server)
        self._secrets: list[str] = secret_values(dict(os.environ))
        if profile_data is not None:
            profile_data = {**profile_data, "env": redact_secrets(profile_data.get("env"), drop=True)}
            if not profile_data["env"]:
                profile_data.pop("env")
        self._config: dict[str, Any] = {"profile": profile_data} if profile_data is not None else {}
        self.plan = plan
        self.run_id: int = store.create_run(name, engine, config=self._config or None, spec=spec, plan=plan,
                                            clock_wall0=clock_wall0)
        self.steps: list[StepStats] = []
        self.by_status: dict[str, int] = {}
        self._lock = threading.Lock()
        self._open = True
        self._summary: tuple[dict[str, Any], ResultsSummary | None] | None = None
        self._writer = StoreWriter(store, self.run_id)
        self._log_after = float("-inf")

    @property
    def open(self) -> bool:
        return self._open

    # ------------------------------------------------------------------ context
    def attach_server(self, supervisor) -> None:
        """The :class:`app.server.supervisor.Supervisor` of the server this run measures:
        its launch config, argv and log-parsed capacity facts are recorded, and the log it
        printed so far (later lines come through :meth:`add_log_line`)."""
        self.supervisor = supervisor
        server = supervisor.config.model_dump(mode="json")
        self._secrets += [v for v in secret_values(server.get("env")) if v not in self._secrets]
        server["env"] = redact_secrets(server.get("env"))
        self._config.update(server=server, argv=redact_argv(list(supervisor.argv)))
        self.gpu_count = supervisor.config.world_size
        self.store.update_run(self.run_id, config=self._config, capacity=supervisor.parser.facts.as_dict())
        lines = list(supervisor.lines.copy())  # deque.copy runs under the GIL: a consistent snapshot
        with self._lock:
            lines = [(t, stream, self._redact(text)) for t, stream, text in lines if t > self._log_after]
            if lines:
                self.store.add_log_lines(self.run_id, lines)
                self._log_after = lines[-1][0]

    def set_context(self, *, spec: Any = None, hardware: HardwareFingerprint | None = None,
                    time_scale: float | None = None, model: str | None = None) -> None:
        """Record the ramp spec (rig seconds), the hardware fingerprint, the sim's time
        scale k and the served model name, as they become known."""
        if spec is not None:
            self.store.update_run(self.run_id, spec=spec)
        if hardware is not None:
            self.hardware = hardware
        if time_scale is not None:
            self.time_scale = float(time_scale or 1.0)
        if model is not None:
            self.model = model

    # ------------------------------------------------------------------ feeds
    def add_log_line(self, stream: str, text: str, t: float) -> None:
        """A server log line (the supervisor's ``on_line`` signature)."""
        if self._open and t > self._log_after:
            self.store.add_log_lines(self.run_id, [(t, stream, self._redact(text))])

    def _redact(self, text: str) -> str:
        return redact_text(text, self._secrets) if self._secrets else text

    def add_samples(self, samples: list) -> None:
        """Telemetry samples ``(t, source, name, value)`` (a sampler subscriber)."""
        if self._open:
            self._writer(samples)

    def add_records(self, records: Iterable[Any]) -> None:
        """Request records (:class:`app.loadgen.records.RequestRecord`)."""
        if not self._open:
            return
        records = list(records)
        with self._lock:
            for r in records:
                self.by_status[r.status] = self.by_status.get(r.status, 0) + 1
        self.store.add_requests(self.run_id, records)

    def add_level(self, st: StepStats) -> None:
        """Store one level's stats, already in rig seconds (written once per level)."""
        with self._lock:
            self.steps = sorted([s for s in self.steps if s.idx != st.idx] + [st], key=lambda s: s.idx)
        if self._open:
            self.store.add_level(self.run_id, st)

    # ------------------------------------------------------------------ end
    def finish(self, status: str, reason: str = "", knee: Knee | None = None, *,
               error: str | None = None, verdict: Any = None,
               users_at_slo: Any = None) -> tuple[dict[str, Any], ResultsSummary | None]:
        """Close the run: telemetry flushed, the capacity facts refreshed, the summary
        written (:func:`run_summary`). Idempotent: a second call returns the first summary."""
        with self._lock:
            if not self._open:
                assert self._summary is not None
                return self._summary
            self._open = False
            steps = list(self.steps)
            by_status = dict(self.by_status)
        self._writer.close()
        capacity = self.supervisor.parser.facts.as_dict() if self.supervisor is not None else None
        reason = self._redact(reason or "")
        error = self._redact(error) if error else error
        self._summary = run_summary(status, reason, steps, knee, run_id=self.run_id, gpu_count=self.gpu_count,
                                    time_scale=self.time_scale, hardware=self.hardware, model=self.model,
                                    requests_by_status=by_status, error=error, verdict=verdict,
                                    users_at_slo=users_at_slo)
        self.store.finish_run(self.run_id, status, summary=self._summary[0], capacity=capacity)
        self.store.flush()
        return self._summary

    def discard(self) -> None:
        """Delete the run (nothing ran: e.g. a failed pre-flight check of ``vllm-dyno ramp``)."""
        with self._lock:
            self._open = False
        self._writer.close()
        self.store.delete_run(self.run_id)
