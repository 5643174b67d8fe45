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

A store that cannot be written (issue 15 item 10: a full disk, a read-only home) never
stops a run nor loses what it measured: every write the store refuses
(:class:`app.store.StoreWriteError`) is kept — the run row, the levels and the fields of
the run in the recorder, the requests, samples and log lines in the store's buffer (or
the recorder's, while the run row does not exist yet) — and :meth:`RunRecorder.save_pending`
writes them all once the store takes them again (the recorder calls it on every level
and at the end; the controller retries after the end). :attr:`RunRecorder.problem` names
the path and the cause meanwhile; ``run_id`` is None until the run row exists.

Times: requests, samples and log lines are session-clock seconds (wall); level stats are
in rig seconds for a sim running ``time_scale``× faster than the wall clock
(:func:`app.loadgen.stats.to_rig_time`; docs/design.md, "Sim time").
"""
from __future__ import annotations

import functools
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from app.config import redact_argv, redact_secrets, redact_text, secret_values
from app.loadgen.spec import RampSpec
from app.loadgen.stats import Knee, StepStats, peak_level
from app.engines import Engine
from app.profiles.model import HardwareFingerprint, Profile, ResultsSummary
from app.server.supervisor import Supervisor
from app.store import RunStore, StoreWriteError
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
    :meth:`finish`. After :meth:`finish` the feeds are ignored. None of them raises for a
    store that cannot be written (module docstring): :attr:`problem`, :attr:`saved` and
    :meth:`save_pending`.
    """

    def __init__(self, store: RunStore, *, name: str, engine: str, profile_data: dict | None,
                 spec: RampSpec | dict[str, Any] | None = None, plan: dict | None = None, gpu_count: int = 1,
                 clock_wall0: float | None = None) -> None:
        self.store = store
        self.engine = engine
        self.time_scale = 1.0
        self.hardware: HardwareFingerprint | None = None
        self.supervisor: Supervisor | None = None
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
        self.steps: list[StepStats] = []
        self.by_status: dict[str, int] = {}
        self._lock = threading.RLock()
        self._open = True
        self._summary: tuple[dict[str, Any], ResultsSummary | None] | None = None
        self._log_after = float("-inf")
        #: why the store does not hold everything yet (path and cause), None when it does
        self.problem: str | None = None
        #: the run row to create (its config is the one known when it is created)
        self._create = functools.partial(store.create_run, name, engine, spec=spec, plan=plan, clock_wall0=clock_wall0)
        self._fields: dict[str, Any] = {}  # run columns not written yet
        self._unsaved_levels: dict[int, StepStats] = {}
        self._early: dict[str, list] = {"requests": [], "server_log": [], "samples": []}  # before the run row
        self._next_try = 0.0
        self.run_id: int | None = None
        self._writer: StoreWriter | None = None
        self._try(self._create_row)

    # ------------------------------------------------------------------ the store's refusals
    def _try(self, write: Callable[[], Any]) -> bool:
        """Run one store write; a refusal (StoreWriteError) is kept as :attr:`problem`."""
        try:
            write()
            return True
        except StoreWriteError as e:
            if self.problem != str(e):
                log.warning("%s: the run is kept in memory and saved when the store can be written", e)
            self.problem = str(e)
            return False

    def _create_row(self) -> None:
        rid = self._create(config=self._config or None)
        self.run_id = rid
        self._writer = StoreWriter(self.store, rid)
        early, self._early = self._early, {"requests": [], "server_log": [], "samples": []}
        if early["server_log"]:
            self.store.add_log_lines(rid, early["server_log"])
        if early["samples"]:
            self.store.add_samples(rid, early["samples"])
        if early["requests"]:
            self.store.add_requests(rid, early["requests"])

    @property
    def saved(self) -> bool:
        """Everything given so far is in the store (committed)."""
        return (self.run_id is not None and not self._fields and not self._unsaved_levels
                and self.store.pending_rows == 0)

    def save_pending(self) -> bool:
        """Write what the store refused so far (the run row, the run's fields, the
        levels, the buffered rows); True when everything is saved. Never raises for a
        store that still cannot be written."""
        with self._lock:
            if self.run_id is None and not self._try(self._create_row):
                return False
            rid = self.run_id
            if rid is None:  # (created just above)
                return False
            if self._fields:
                fields = dict(self._fields)
                if not self._try(lambda: self.store.update_run(rid, **fields)):
                    return False
                for k in fields:
                    if self._fields.get(k) is fields[k]:
                        self._fields.pop(k)
            for idx, st in sorted(self._unsaved_levels.items()):
                if not self._try(functools.partial(self.store.add_level, rid, st)):
                    return False
                self._unsaved_levels.pop(idx, None)
            if not self._try(self.store.flush):
                return False
            self.problem = None
            return True

    def _maybe_retry(self) -> None:
        """While something is unsaved, try again at most every 2 s (from a feed)."""
        if self.problem is not None and time.monotonic() >= self._next_try:
            self._next_try = time.monotonic() + 2.0
            self.save_pending()

    def _update(self, **fields: Any) -> None:
        """Set run columns now, or keep them for :meth:`save_pending`."""
        with self._lock:
            self._fields.update(fields)
            rid = self.run_id
            if rid is not None and self.problem is None:
                pending = dict(self._fields)
                if self._try(lambda: self.store.update_run(rid, **pending)):
                    for k in pending:
                        if self._fields.get(k) is pending[k]:
                            self._fields.pop(k)

    @property
    def open(self) -> bool:
        return self._open

    # ------------------------------------------------------------------ context
    def attach_server(self, supervisor: Supervisor) -> None:
        """The :class:`app.server.supervisor.Supervisor` of the server this run measures:
        its launch config, argv and log-parsed capacity facts are recorded, and the log it
        printed so far (later lines come through :meth:`add_log_line`)."""
        self.supervisor = supervisor
        server = supervisor.config.model_dump(mode="json")
        self._secrets += [v for v in secret_values(server.get("env")) if v not in self._secrets]
        server["env"] = redact_secrets(server.get("env"))
        self._config.update(server=server, argv=redact_argv(list(supervisor.argv)))
        self.gpu_count = supervisor.config.world_size
        self._update(config=dict(self._config), capacity=supervisor.parser.facts.as_dict())
        lines = list(supervisor.lines.copy())  # deque.copy runs under the GIL: a consistent snapshot
        with self._lock:
            lines = [(t, stream, self._redact(text)) for t, stream, text in lines if t > self._log_after]
            if lines:
                self._add_rows("server_log", lines)
                self._log_after = lines[-1][0]

    def set_context(self, *, spec: RampSpec | dict[str, Any] | None = None, hardware: HardwareFingerprint | None = None,
                    time_scale: float | None = None, model: str | None = None,
                    lengths: dict | None = None, hosts: list[dict] | None = None) -> None:
        """Record the ramp spec (rig seconds), the hardware fingerprint, the sim's time
        scale k and the served model name, as they become known; ``lengths``: a dataset
        ramp's length histograms (:func:`app.loadgen.prompts.dataset_lengths`), kept in
        the run's ``config`` as ``config["lengths"]``; ``hosts``: a rig's parts (``host``,
        ``role``, ``rank``, ``server`` its ServerConfig as JSON, ``argv``), kept as
        ``config["hosts"]`` with secrets redacted as :meth:`attach_server` does."""
        if spec is not None:
            self._update(spec=spec)
        if hosts is not None:
            rows = []
            for h in hosts:
                server = dict(h.get("server") or {})
                self._secrets += [v for v in secret_values(server.get("env")) if v not in self._secrets]
                server["env"] = redact_secrets(server.get("env"))
                rows.append({**h, "server": server, "argv": redact_argv(list(h.get("argv") or []))})
            self._config["hosts"] = rows
            self._update(config=dict(self._config))
        if lengths is not None:
            self._config["lengths"] = lengths
            self._update(config=dict(self._config))
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
            self._add_rows("server_log", [(t, stream, self._redact(text))])

    def _redact(self, text: str) -> str:
        return redact_text(text, self._secrets) if self._secrets else text

    def _add_rows(self, table: str, rows: list) -> None:
        """Buffered rows into the store (which keeps them until a commit succeeds), or
        into the recorder while the run row does not exist yet."""
        with self._lock:
            rid = self.run_id
            if rid is None:
                self._early[table].extend(rows)
                self._maybe_retry()
                return
        if table == "server_log":
            self.store.add_log_lines(rid, rows)
        elif table == "requests":
            self.store.add_requests(rid, rows)
        else:
            self.store.add_samples(rid, rows)

    def add_samples(self, samples: list) -> None:
        """Telemetry samples ``(t, source, name, value)`` (a sampler subscriber)."""
        if not self._open:
            return
        if self._writer is not None:
            self._writer(samples)
        else:
            self._add_rows("samples", list(samples))

    def add_records(self, records: Iterable[Any]) -> None:
        """Request records (:class:`app.loadgen.records.RequestRecord`)."""
        if not self._open:
            return
        records = list(records)
        with self._lock:
            for r in records:
                self.by_status[r.status] = self.by_status.get(r.status, 0) + 1
        self._add_rows("requests", records)

    def add_level(self, st: StepStats) -> None:
        """Store one level's stats, already in rig seconds (written once per level)."""
        with self._lock:
            self.steps = sorted([s for s in self.steps if s.idx != st.idx] + [st], key=lambda s: s.idx)
            if not self._open:
                return
            self._unsaved_levels[st.idx] = st
            rid = self.run_id
            if self.problem is None and rid is not None:
                if self._try(lambda: self.store.add_level(rid, st)):
                    self._unsaved_levels.pop(st.idx, None)
            else:
                self._maybe_retry()

    # ------------------------------------------------------------------ end
    def finish(self, status: str, reason: str = "", knee: Knee | None = None, *,
               error: str | None = None, verdict: Any = None,
               users_at_slo: Any = None) -> tuple[dict[str, Any], ResultsSummary | None]:
        """Close the run: telemetry flushed, the capacity facts refreshed, the summary
        written (:func:`run_summary`). Idempotent: a second call returns the first summary.
        When the store cannot take it all, the summary is still returned, :attr:`problem`
        says why and :meth:`save_pending` writes the rest later."""
        with self._lock:
            if not self._open:
                assert self._summary is not None
                return self._summary
            self._open = False
            steps = list(self.steps)
            by_status = dict(self.by_status)
        if self._writer is not None:
            self._writer.close()
        capacity = self.supervisor.parser.facts.as_dict() if self.supervisor is not None else None
        reason = self._redact(reason or "")
        error = self._redact(error) if error else error
        self._summary = run_summary(status, reason, steps, knee, run_id=self.run_id, gpu_count=self.gpu_count,
                                    time_scale=self.time_scale, hardware=self.hardware, model=self.model,
                                    requests_by_status=by_status, error=error, verdict=verdict,
                                    users_at_slo=users_at_slo)
        fields: dict[str, Any] = {"status": status, "finished": time.time(), "summary": self._summary[0]}
        if capacity is not None:
            fields["capacity"] = capacity
        with self._lock:
            self._fields.update(fields)  # store.finish_run's fields, kept until written
        self.save_pending()
        return self._summary

    def discard(self) -> None:
        """Delete the run (nothing ran: e.g. a failed pre-flight check of ``vllm-dyno ramp``)."""
        with self._lock:
            self._open = False
            self._fields.clear()
            self._unsaved_levels.clear()
        if self._writer is not None:
            self._writer.close()
        rid = self.run_id
        if rid is not None:
            self._try(lambda: self.store.delete_run(rid))


@dataclass
class RecordSpec:
    """How a run is recorded: the ``profile`` snapshot (None for ``vllm-dyno ramp``),
    the planner's ``plan.as_dict()`` and the run's ``name`` (default: the profile's)."""

    profile: Profile | None = None
    plan: dict | None = None
    name: str | None = None


def recorder_for(store: RunStore, record: RecordSpec, spec: RampSpec | dict[str, Any] | None = None, *,
                 engine: Engine, url: str | None = None, clock_wall0: float | None = None) -> RunRecorder:
    """A new run in ``store`` as ``record`` says: its name (``record.name``, the profile's,
    else ``"ramp URL"``), its engine (the profile's, else ``engine``), the profile snapshot,
    the ramp ``spec``, the plan and the cards a profile's layout uses (1 without one).
    ``clock_wall0``: the session clock's wall time at 0 (s since the epoch)."""
    prof = record.profile
    name = record.name or (prof.name if prof is not None else f"ramp {url or ''}".strip())
    gpu_count = 1
    if prof is not None:
        try:
            gpu_count = prof.server_config(resolve=False).world_size
        except Exception:
            gpu_count = 1
    return RunRecorder(store, name=name, engine=prof.engine if prof is not None else engine,
                       profile_data=prof.to_data() if prof else None, spec=spec, plan=record.plan,
                       gpu_count=gpu_count, clock_wall0=clock_wall0)
